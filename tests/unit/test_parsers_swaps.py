"""/proc/swaps and /proc/meminfo parsers, and the swap_off module's refusal and fstab edit, on fixture trees."""

import errno
import json
import os
import shutil
import time

import pytest
from conftest import FIXTURES, role_module

from ansible.module_utils.llmtune_sysfs import parse_meminfo, parse_proc_swaps, read_text
from ansible.module_utils.testing import patch_module_args

TUNING = os.path.join(FIXTURES, "tuning")

# swap_off ships inside the swap role (roles/swap/library), not library/.
swap_off = role_module("swap", "swap_off")


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


def test_plan_turns_off_what_memory_absorbs_smallest_first():
    big, small, idle = ({"filename": "/dev/sda3", "used_kb": 6291456}, {"filename": "/dev/zram0", "used_kb": 1048576},
                        {"filename": "/var/swap", "used_kb": 0})
    turn_off, refused = swap_off.plan_swapoff([big, small, idle], 2097152, 262144)
    assert turn_off == [idle, small]
    # /dev/zram0's pages took 1 GiB of the 2 GiB available
    assert refused == [(big, 6291456 + 262144 - (2097152 - 1048576))]
    assert swap_off.plan_swapoff([big], 8388608, 262144) == ([big], [])


def test_available_memory():
    assert swap_off.available_kb({"MemAvailable": 4194304, "MemFree": 1024}) == 4194304
    # kernels before 3.14 have no MemAvailable
    assert swap_off.available_kb({"MemFree": 6553600}) == 6553600


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
        if fstab:  # None: the tree has its own etc/fstab
            (root / "etc").mkdir()
            shutil.copy(os.path.join(TUNING, "fstab", fstab), root / "etc" / "fstab")
        return root
    return make


SDA7_REASON = "not enough memory: 3417 MiB of swap in use, MemAvailable 1181 MiB, margin 256 MiB (2493 MiB short)"


def test_low_memory_leaves_swap_on_but_keeps_it_off_at_boot(sysroot, tmp_path, capsys):
    # issue 17 input 4: MemAvailable 1210000 kB, /dev/sda7 with 3500000 kB in use, fstab "/dev/sda7 none swap sw 0 0"
    root = sysroot("sda7-low-memory", None)
    fstab = root / "etc" / "fstab"
    state = tmp_path / "state.json"
    args = {"sysroot": str(root), "state_path": str(state)}
    result = run_swap_off(args, capsys, False)
    assert "failed" not in result
    assert result["changed"] is True
    assert result["swapped_off"] == []
    assert result["left_on"] == [{"filename": "/dev/sda7", "reason": SDA7_REASON}]
    assert result["reboot_required"] is True
    assert result["runtime_reason"] == "/dev/sda7: " + SDA7_REASON
    assert [w["event"]["msg"] for w in result["warnings"]] == [
        "swap left on until the next reboot: /dev/sda7: " + SDA7_REASON]
    assert result["fstab_commented"] == ["/dev/sda7 none swap sw 0 0"]
    assert fstab.read_text() == "#llmtune# /dev/sda7 none swap sw 0 0\n"
    assert open(result["backup"]).read() == "/dev/sda7 none swap sw 0 0\n"
    recorded = json.loads(state.read_text())
    assert recorded["settings"]["swap.areas"]["original"] == "/dev/sda7"
    assert recorded["files"][str(fstab)]["backup"] == result["backup"]
    # second run: nothing left to change, the reboot is still due
    again = run_swap_off(args, capsys, False)
    assert again["changed"] is False and again["reboot_required"] is True
    assert again["fstab_commented"] == [] and again["backup"] is None


def test_low_memory_check_mode_changes_nothing(sysroot, tmp_path, capsys):
    root = sysroot("sda7-low-memory", None)
    result = run_swap_off({"sysroot": str(root), "state_path": str(tmp_path / "state.json")}, capsys, True)
    assert result["changed"] is True and result["reboot_required"] is True
    assert result["left_on"] == [{"filename": "/dev/sda7", "reason": SDA7_REASON}]
    assert result["diff"]["after"] == "#llmtune# /dev/sda7 none swap sw 0 0\n"
    assert (root / "etc" / "fstab").read_text() == "/dev/sda7 none swap sw 0 0\n"
    assert not (tmp_path / "state.json").exists()


def test_areas_that_fit_go_off_the_others_stay(sysroot, tmp_path, capsys):
    # epyc-acpi: /dev/sda3 holds more than MemAvailable, the idle swap file does not
    root = sysroot("epyc-acpi", "debian-installer")
    result = run_swap_off({"sysroot": str(root), "state_path": str(tmp_path / "state.json")}, capsys, True)
    assert result["swapped_off"] == ["/var/swap file"]
    assert result["left_on"] == [{"filename": "/dev/sda3", "reason": "not enough memory: 6144 MiB of swap in use, "
                                  "MemAvailable 4096 MiB, margin 256 MiB (2304 MiB short)"}]
    assert result["reboot_required"] is True
    assert len(result["fstab_commented"]) == 1


@pytest.mark.parametrize("code, reason", [
    (None, "swapoff timed out after 5 s, the kernel kept the area"),
    (-9, "swapoff killed by signal 9, the kernel kept the area"),
    (errno.ENOMEM, "swapoff refused by the kernel: Cannot allocate memory"),
])
def test_swapoff_cut_short_leaves_the_area_on(sysroot, tmp_path, capsys, monkeypatch, code, reason):
    root = sysroot("xeon-spr", "ubuntu-cloud")
    calls = []
    monkeypatch.setattr(swap_off, "swapoff", lambda path, timeout_s: calls.append((path, timeout_s)) or
                        (code if path == "/swap.img" else 0))
    result = run_swap_off({"sysroot": str(root), "state_path": str(tmp_path / "state.json"), "swapoff_timeout_s": 5},
                          capsys, False)
    # smallest use first: zram0 (1 MiB), then the swap file (256 MiB)
    assert calls == [("/dev/zram0", 5), ("/swap.img", 5)]
    assert result["swapped_off"] == ["/dev/zram0"]
    assert result["left_on"] == [{"filename": "/swap.img", "reason": reason}]
    assert result["reboot_required"] is True


def test_swapoff_timeout_must_be_positive(sysroot, tmp_path, capsys):
    root = sysroot("xeon-spr", "ubuntu-cloud")
    result = run_swap_off({"sysroot": str(root), "state_path": str(tmp_path / "state.json"), "swapoff_timeout_s": 0},
                          capsys, True)
    assert result["failed"] is True
    assert result["msg"] == "swapoff_timeout_s must be at least 1 (seconds), got 0"


def test_check_mode_reports_swapoff_and_fstab_diff(sysroot, tmp_path, capsys):
    root = sysroot("xeon-spr", "ubuntu-cloud")
    before = (root / "etc" / "fstab").read_text()
    result = run_swap_off({"sysroot": str(root), "state_path": str(tmp_path / "state.json")}, capsys, True)
    assert result["changed"] is True
    # smallest use first
    assert result["swapped_off"] == ["/dev/zram0", "/swap.img"]
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
    assert swap_off.swapoff(str(tmp_path / "no-such-swapfile"), 10) == errno.ENOENT


def test_swapoff_is_killed_after_its_timeout(monkeypatch):
    # a swapoff(2) that would take a minute; the forked child runs the patched function
    monkeypatch.setattr(swap_off, "_swapoff_child", lambda path: time.sleep(60))
    started = time.monotonic()
    assert swap_off.swapoff("/dev/sda7", 1) is None
    assert time.monotonic() - started < 10
