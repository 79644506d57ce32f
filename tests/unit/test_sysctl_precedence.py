"""Which sysctl.d file wins at boot (module_utils/llmtune_sysctl.py, library/sysctl_precedence.py, and the
drift row of library/tuning_drift.py), on fixture trees under tests/fixtures/sysctl/.

debian12-sysctl-conf is issue 17's input 8 on a Debian 12 host tuned by the earlier role version: Debian's
/etc/sysctl.conf with `vm.swappiness = 60` added (line 70), linked as /etc/sysctl.d/99-sysctl.conf as
systemd ships it, /usr/lib/sysctl.d/50-vendor.conf with `kernel.numa_balancing = 1`, systemd's and
procps' own files, /lib a link to usr/lib (merged /usr), and the former 90-llmtune-*.conf files.
"""

import json
import os
import shutil

import pytest
import sysctl_precedence
import tuning_drift
from ansible.module_utils.common import warnings
from ansible.module_utils.llmtune_state import load_state
from ansible.module_utils.llmtune_sysctl import (COMMENT_MARK, key_path, overriding_assignments, parse_sysctl_text,
                                                  sysctl_order)
from ansible.module_utils.testing import patch_module_args
from conftest import FIXTURES

SWAP = "/etc/sysctl.d/zz-llmtune-swap.conf"
NUMA = "/etc/sysctl.d/zz-llmtune-numa.conf"
LEGACY_SWAP = "/etc/sysctl.d/90-llmtune-swap.conf"
LEGACY_NUMA = "/etc/sysctl.d/90-llmtune-numa.conf"
SWAPPINESS_60 = "vm.swappiness = 60"


@pytest.fixture(name="root")
def fixture_root(tmp_path):
    """A copy of the issue's host, symlinks kept as links."""
    root = tmp_path / "debian12-sysctl-conf"
    shutil.copytree(os.path.join(FIXTURES, "sysctl", "debian12-sysctl-conf"), root, symlinks=True)
    return root


def run(module, args, capsys, check=False):
    warnings._global_warnings.clear()
    with patch_module_args(dict(args, _ansible_check_mode=check, _ansible_diff=True)), pytest.raises(SystemExit):
        module.main()
    result = json.loads(capsys.readouterr().out)
    result["warnings"] = [w["event"]["msg"] for w in result.get("warnings", [])]
    return result


def snapshot(root):
    """Every path under root with its link target or bytes, to prove a run wrote nothing."""
    out = {}
    for path in sorted(root.rglob("*")):
        out[str(path)] = os.readlink(path) if path.is_symlink() else None if path.is_dir() else path.read_bytes()
    return out


# --- the parser ------------------------------------------------------------------------------------

def test_order_is_by_name_across_directories_with_etc_sysctl_conf_last_for_procps(root):
    order = [(f["name"], f["path"], f["real"], f["reader"]) for f in sysctl_order(str(root))]
    assert order == [
        ("50-pid-max.conf", "/usr/lib/sysctl.d/50-pid-max.conf", "/usr/lib/sysctl.d/50-pid-max.conf", "systemd-sysctl"),
        ("50-vendor.conf", "/usr/lib/sysctl.d/50-vendor.conf", "/usr/lib/sysctl.d/50-vendor.conf", "systemd-sysctl"),
        ("90-llmtune-numa.conf", LEGACY_NUMA, LEGACY_NUMA, "systemd-sysctl"),
        ("90-llmtune-swap.conf", LEGACY_SWAP, LEGACY_SWAP, "systemd-sysctl"),
        ("99-protect-links.conf", "/usr/lib/sysctl.d/99-protect-links.conf", "/usr/lib/sysctl.d/99-protect-links.conf",
         "systemd-sysctl"),
        # the link systemd ships: /etc/sysctl.conf read in its place
        ("99-sysctl.conf", "/etc/sysctl.d/99-sysctl.conf", "/etc/sysctl.conf", "systemd-sysctl"),
        ("sysctl.conf", "/etc/sysctl.conf", "/etc/sysctl.conf", "sysctl --system")]


def test_issue_input_swappiness_is_overridden_and_numa_balancing_is_not(root):
    # 99-sysctl.conf sorts after 90-llmtune-swap.conf: at boot vm.swappiness ends at 60
    later = overriding_assignments(str(root), LEGACY_SWAP, {"vm.swappiness": 1})
    assert [(a["file"], a["line"], a["value"], a["reader"]) for a in later] == [
        ("/etc/sysctl.d/99-sysctl.conf", 70, "60", "systemd-sysctl"), ("/etc/sysctl.conf", 70, "60", "sysctl --system")]
    # 50-vendor.conf sorts before 90-llmtune-numa.conf (sysctl.d(5): by file name across directories),
    # so ours already wins for kernel.numa_balancing
    assert overriding_assignments(str(root), LEGACY_NUMA, {"kernel.numa_balancing": 0}) == []
    # with our new name only `sysctl --system` still reads /etc/sysctl.conf after us
    assert [(a["file"], a["reader"]) for a in overriding_assignments(str(root), SWAP, {"vm.swappiness": "1"})] == [
        ("/etc/sysctl.conf", "sysctl --system")]


def test_same_name_in_an_earlier_directory_masks_and_dev_null_masks_for_good(root):
    run_dir = root / "run/sysctl.d"
    run_dir.mkdir(parents=True)
    (run_dir / "zzz-runtime.conf").write_text("vm.swappiness = 100\n")
    (root / "usr/lib/sysctl.d/zzz-runtime.conf").write_text("vm.swappiness = 200\n")
    (root / "etc/sysctl.d/zzz-masked.conf").symlink_to("/dev/null")
    (root / "usr/lib/sysctl.d/zzz-masked.conf").write_text("vm.swappiness = 30\n")
    (root / "etc/sysctl.d/zzz-dir.conf").mkdir()
    (root / "etc/sysctl.d/.zzz-hidden.conf").write_text("vm.swappiness = 40\n")
    later = overriding_assignments(str(root), SWAP, {"vm.swappiness": "1"})
    assert [(a["file"], a["value"]) for a in later] == [("/run/sysctl.d/zzz-runtime.conf", "100"),
                                                        ("/etc/sysctl.conf", "60")]


@pytest.mark.parametrize("line, key, path, value", [
    ("vm.swappiness=60", "vm.swappiness", "vm/swappiness", "60"),
    ("  vm/swappiness =  60 ", "vm/swappiness", "vm/swappiness", "60"),
    ("-vm.swappiness = 60", "vm.swappiness", "vm/swappiness", "60"),
    ("net.ipv4.conf.enp3s0/200.forwarding = 1", "net.ipv4.conf.enp3s0/200.forwarding",
     "net/ipv4/conf/enp3s0.200/forwarding", "1"),
    ("net.ipv4.ip_local_port_range = 32768\t60999", "net.ipv4.ip_local_port_range", "net/ipv4/ip_local_port_range",
     "32768 60999"),
])
def test_line_forms_of_sysctl_d(line, key, path, value):
    [assignment] = parse_sysctl_text("# comment\n; comment\n\n-kernel.exclude.*\n" + line + "\n")
    assert (assignment["line"], assignment["key"], assignment["path"], assignment["value"]) == (5, key, path, value)
    assert key_path("kernel.numa_balancing") == key_path("kernel/numa_balancing") == "kernel/numa_balancing"


def test_globs_and_equal_values_do_not_override(root):
    (root / "etc/sysctl.d/zzz-local.conf").write_text("vm.swap* = 10\nvm.swappiness = 1\nvm/swappiness = 5\n")
    later = overriding_assignments(str(root), SWAP, {"vm.swappiness": 1})
    assert [(a["file"], a["line"], a["key"]) for a in later] == [
        ("/etc/sysctl.d/zzz-local.conf", 3, "vm/swappiness"), ("/etc/sysctl.conf", 70, "vm.swappiness")]


# --- the module --------------------------------------------------------------------------------------

def swap_args(root, tmp_path):
    return {"path": SWAP, "settings": {"vm.swappiness": 1}, "legacy_path": LEGACY_SWAP,
            "state_path": str(tmp_path / "state.json"), "sysroot": str(root)}


def test_issue_input_swap_file_renamed_and_sysctl_conf_line_commented_with_backup(root, tmp_path, capsys):
    (root / SWAP.lstrip("/")).write_text((root / LEGACY_SWAP.lstrip("/")).read_text())  # what the template wrote
    original = (root / "etc/sysctl.conf").read_text()
    result = run(sysctl_precedence, swap_args(root, tmp_path), capsys)
    assert result["changed"] is True and result["legacy_removed"] is True
    assert result["overrides"] == ["/etc/sysctl.conf:70: vm.swappiness = 60 (applied after ours by sysctl --system)"]
    assert result["fixed"] == [{"file": "/etc/sysctl.conf", "action": "commented", "source": "/etc/sysctl.conf",
                                "lines": [70]}]
    assert not (root / LEGACY_SWAP.lstrip("/")).exists()
    text = (root / "etc/sysctl.conf").read_text()
    assert text == original.replace("\n" + SWAPPINESS_60 + "\n", "\n" + COMMENT_MARK + SWAPPINESS_60 + "\n")
    assert os.readlink(root / "etc/sysctl.d/99-sysctl.conf") == "../sysctl.conf"
    entry = load_state(str(tmp_path / "state.json"))["files"][str(root / "etc/sysctl.conf")]
    assert entry["existed"] is True
    with open(entry["backup"]) as handle:
        assert handle.read() == original
    # every reader now ends with ours
    assert overriding_assignments(str(root), SWAP, {"vm.swappiness": 1}) == []
    again = run(sysctl_precedence, swap_args(root, tmp_path), capsys)
    assert (again["changed"], again["overrides"], again["fixed"], again["legacy_removed"]) == (False, [], [], False)


def test_issue_input_numa_file_needs_no_other_change(root, tmp_path, capsys):
    vendor = (root / "usr/lib/sysctl.d/50-vendor.conf").read_text()
    result = run(sysctl_precedence, {"path": NUMA, "settings": {"kernel.numa_balancing": "0"},
                                     "legacy_path": LEGACY_NUMA, "state_path": str(tmp_path / "state.json"),
                                     "sysroot": str(root)}, capsys)
    assert (result["changed"], result["overrides"], result["fixed"], result["legacy_removed"]) == (True, [], [], True)
    assert (root / "usr/lib/sysctl.d/50-vendor.conf").read_text() == vendor
    assert not (root / LEGACY_NUMA.lstrip("/")).exists()


def test_check_mode_reports_and_writes_nothing(root, tmp_path, capsys):
    before = snapshot(root)
    result = run(sysctl_precedence, swap_args(root, tmp_path), capsys, check=True)
    assert result["changed"] is True and len(result["fixed"]) == 1 and result["legacy_removed"] is True
    assert COMMENT_MARK + SWAPPINESS_60 in result["diff"][0]["after"]
    assert snapshot(root) == before and not (tmp_path / "state.json").exists()


def test_package_file_after_ours_is_masked_from_etc_not_edited(root, tmp_path, capsys):
    vendor = root / "usr/lib/sysctl.d/zz-numa-vendor.conf"
    vendor.write_text("# from a package\nkernel.numa_balancing = 1\nkernel.sched_autogroup_enabled = 0\n")
    args = {"path": NUMA, "settings": {"kernel.numa_balancing": "0"}, "state_path": str(tmp_path / "state.json"),
            "sysroot": str(root)}
    result = run(sysctl_precedence, args, capsys)
    mask = root / "etc/sysctl.d/zz-numa-vendor.conf"
    assert result["fixed"] == [{"file": "/etc/sysctl.d/zz-numa-vendor.conf", "action": "masked",
                                "source": "/usr/lib/sysctl.d/zz-numa-vendor.conf", "lines": [2]}]
    assert vendor.read_text().startswith("# from a package\nkernel.numa_balancing = 1\n")
    assert mask.read_text().endswith("# from a package\n" + COMMENT_MARK + "kernel.numa_balancing = 1\n"
                                     "kernel.sched_autogroup_enabled = 0\n")
    assert oct(mask.stat().st_mode & 0o777) == "0o644"
    # a rollback removes the mask: it did not exist before
    assert load_state(str(tmp_path / "state.json"))["files"][str(mask)]["existed"] is False
    assert result["warnings"] == ["/etc/sysctl.d/zz-numa-vendor.conf: masks /usr/lib/sysctl.d/zz-numa-vendor.conf, "
                                  "line 2 commented out so that %s wins at boot" % NUMA]
    assert run(sysctl_precedence, args, capsys)["changed"] is False


def test_our_file_must_be_in_etc_sysctl_d(root, tmp_path, capsys):
    result = run(sysctl_precedence, dict(swap_args(root, tmp_path), path="/usr/lib/sysctl.d/zz-llmtune-swap.conf"),
                 capsys)
    assert result["failed"] is True and result["msg"].startswith("path must be a .conf file in /etc/sysctl.d")


# --- the drift check -----------------------------------------------------------------------------------

def test_drift_check_reports_a_later_file_that_overrides_us(root, tmp_path, capsys):
    files = [{"name": "swap.sysctl_precedence", "path": LEGACY_SWAP, "settings": {"vm.swappiness": "1"}},
             {"name": "numa.sysctl_precedence", "path": LEGACY_NUMA, "settings": {"kernel.numa_balancing": "0"}}]
    rows = run(tuning_drift, {"sysroot": str(root), "sysctl_files": files}, capsys, check=True)["rows"]
    assert [(r["setting"], r["actual"], r["status"]) for r in rows] == [
        ("swap.sysctl_precedence",
         "/etc/sysctl.d/99-sysctl.conf:70: vm.swappiness = 60 (applied after ours by systemd-sysctl); "
         "/etc/sysctl.conf:70: vm.swappiness = 60 (applied after ours by sysctl --system)", "drift"),
        ("numa.sysctl_precedence", "no later file sets kernel.numa_balancing", "ok")]

    run(sysctl_precedence, swap_args(root, tmp_path), capsys)
    files[0]["path"] = SWAP
    rows = run(tuning_drift, {"sysroot": str(root), "sysctl_files": files}, capsys, check=True)["rows"]
    assert [(r["setting"], r["actual"], r["status"]) for r in rows][0] == (
        "swap.sysctl_precedence", "no later file sets vm.swappiness", "ok")
