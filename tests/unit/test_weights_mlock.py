"""weights_mlock: the memory lock an engine's unit asks for its weights, and why none. The probe through a real
transient unit runs in molecule llama_cpp (its verify checks VmLck against the weights) and the VM."""

import os
import shutil

import pytest
import weights_mlock  # noqa: E402  (library/ is on sys.path via conftest)
from test_engines import run_module


@pytest.mark.parametrize("size, wanted", [(1, 17 * 2**20), (2**20, 17 * 2**20), (2**20 + 1, 18 * 2**20),
                                          (19188 * 1024, 35 * 2**20)])
def test_the_lock_is_the_weights_rounded_up_to_mib_plus_16_mib(size, wanted):
    assert weights_mlock.wanted_bytes(size) == wanted


@pytest.mark.parametrize("line, want, ok", [
    ("Max locked memory         8388608              8388608              bytes", 20 * 2**20, False),
    ("Max locked memory         37748736             37748736             bytes", 37748736, True),
    ("Max locked memory         unlimited            unlimited            bytes", 2**40, True),
    ("", 1, False),
])
def test_the_hard_limit_the_unit_got_decides(line, want, ok):
    assert weights_mlock.granted(line, want) is ok


def test_each_reason_not_to_lock_is_said(tmp_path, capsys):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    args = {"path": str(gguf), "engine": "vllm", "engine_locks": False, "_ansible_check_mode": True}
    result = run_module(args, capsys, weights_mlock)
    assert (result["changed"], result["bytes"], result["skipped"]) == (False, 0, "vllm has no option to lock its weights")
    args.update(engine="llama_cpp", engine_locks=True, wanted=False)
    assert run_module(args, capsys, weights_mlock)["skipped"] == "inference_service_mlock is false"
    args.update(wanted=True, path=str(tmp_path / "absent.gguf"))
    assert run_module(args, capsys, weights_mlock)["skipped"] == "the GGUF file is not on the host yet (check mode)"


def test_where_systemd_cannot_start_the_probe_the_reason_is_its_own(tmp_path, capsys):
    """This controller has systemd-run but no systemd as PID 1: the probe's own error is the reason."""
    if not shutil.which("systemd-run") or os.path.isdir("/run/systemd/system"):
        pytest.skip("needs systemd-run on a host not booted with systemd")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"G" * 3 * 2**20)
    result = run_module({"path": str(gguf), "engine": "llama_cpp", "engine_locks": True}, capsys, weights_mlock)
    assert result["bytes"] == 0 and result["skipped"].startswith(
        f"systemd could not raise the memlock limit to {19 * 2**20} bytes here (")
    assert "systemd" in result["skipped"].split("(", 1)[1]
