"""/proc/swaps and /proc/meminfo parsers, and the swap_off module's refusal and fstab edit, on fixture trees."""

import errno
import importlib.util
import json
import os
import shutil

import pytest
from conftest import FIXTURES, ROOT

from ansible.module_utils.llmtune_sysfs import parse_meminfo, parse_proc_swaps, read_text
from ansible.module_utils.testing import patch_module_args

TUNING = os.path.join(FIXTURES, "tuning")

# swap_off ships inside the swap role (roles/swap/library), not library/.
_SPEC = importlib.util.spec_from_file_location("swap_off", os.path.join(ROOT, "roles", "swap", "library", "swap_off.py"))
swap_off = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(swap_off)


def test_proc_swaps_file_and_zram():
    assert parse_proc_swaps(read_text(os.path.join(TUNING, "xeon-spr"), "/proc/swaps")) == [
        {"filename": "/swap.img", "type": "file", "size_kb": 8388604, "used_kb": 262144, "priority": -2},
        {"filename": "/dev/zram0", "type": "partition", "size_kb": 4030460, "used_kb": 1024, "priority": 100},
    ]


def test_proc_swaps_escaped_space_and_header_only():
    areas = parse_proc_swaps(read_text(os.path.join(TUNING, "epyc-acpi"), "/proc/swaps"))
    assert [(a["filename"], a["used_kb"]) for a in areas] == [("/dev/sda3", 6291456), ("/var/swap file", 0)]
    assert parse_proc_swaps(read_text(os.path.join(TUNING, "graviton3"), "/proc/swaps")) == []


def test_meminfo():
    info = parse_meminfo(read_text(os.path.join(TUNING, "xeon-spr"), "/proc/meminfo"))
    assert info["MemAvailable"] == 250123456
    assert info["SwapFree"] == 12155896
    assert info["HugePages_Total"] == 0
    assert "MemAvailable" not in parse_meminfo(read_text(os.path.join(TUNING, "graviton3"), "/proc/meminfo"))


def test_memory_shortfall():
    swaps = [{"used_kb": 6291456}]
    assert swap_off.memory_shortfall_kb(swaps, {"MemAvailable": 4194304}, 262144) == 2359296
    assert swap_off.memory_shortfall_kb(swaps, {"MemAvailable": 8388608}, 262144) == 0
    # kernels before 3.14 have no MemAvailable
    assert swap_off.memory_shortfall_kb(swaps, {"MemFree": 6553600}, 0) == 0


def run_swap_off(args, capsys, check_mode):
    with patch_module_args(dict(args, _ansible_check_mode=check_mode, _ansible_diff=True)):
        with pytest.raises(SystemExit):
            swap_off.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture(name="sysroot")
def fixture_sysroot(tmp_path):
    def make(tree, fstab):
        root = tmp_path / tree
        shutil.copytree(os.path.join(TUNING, tree), root)
        (root / "etc").mkdir()
        shutil.copy(os.path.join(TUNING, "fstab", fstab), root / "etc" / "fstab")
        return root
    return make


def test_refuses_when_memory_cannot_absorb_swap(sysroot, tmp_path, capsys):
    root = sysroot("epyc-acpi", "debian-installer")
    result = run_swap_off({"sysroot": str(root), "state_path": str(tmp_path / "state.json")}, capsys, False)
    assert result["failed"] is True
    assert result["msg"] == ("refusing swapoff: 6144 MiB of swap in use, MemAvailable 4096 MiB, margin 256 MiB; "
                             "2304 MiB short, nothing changed")
    assert (root / "etc" / "fstab").read_text() == open(os.path.join(TUNING, "fstab", "debian-installer")).read()
    assert not (tmp_path / "state.json").exists()


def test_check_mode_reports_swapoff_and_fstab_diff(sysroot, tmp_path, capsys):
    root = sysroot("xeon-spr", "ubuntu-cloud")
    before = (root / "etc" / "fstab").read_text()
    result = run_swap_off({"sysroot": str(root), "state_path": str(tmp_path / "state.json")}, capsys, True)
    assert result["changed"] is True
    assert result["swapped_off"] == ["/swap.img", "/dev/zram0"]
    assert result["fstab_commented"] == ["/swap.img\tnone\tswap\tsw\t0\t0"]
    assert result["diff"]["after"] == before.replace("/swap.img", "#llmtune# /swap.img")
    assert (root / "etc" / "fstab").read_text() == before
    assert not (tmp_path / "state.json").exists()


def test_fstab_edit_backs_up_once(sysroot, tmp_path, capsys):
    root = sysroot("graviton3", "rhel9")
    fstab = root / "etc" / "fstab"
    before = fstab.read_text()
    args = {"sysroot": str(root), "state_path": str(tmp_path / "state.json"), "swapoff": False}
    first = run_swap_off(args, capsys, False)
    assert first["changed"] is True
    assert first["backup"] == str(tmp_path / "backup" / str(fstab).lstrip("/"))
    assert open(first["backup"]).read() == before
    assert fstab.read_text().count("#llmtune# ") == 2
    second = run_swap_off(args, capsys, False)
    assert second["changed"] is False
    assert second["fstab_commented"] == []
    assert open(first["backup"]).read() == before


def test_swapoff_reports_errno(tmp_path):
    # a path that is no swap area: the kernel answers ENOENT, nothing on the host changes
    assert swap_off.swapoff(str(tmp_path / "no-such-swapfile")) == errno.ENOENT
