"""kernel_setting module on copies of fixture sysroots, and on a real read-only sysfs attribute."""

import json
import os
import shutil

import kernel_setting
import pytest
from conftest import FIXTURES

from ansible.module_utils.testing import patch_module_args

TUNING = os.path.join(FIXTURES, "tuning")
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
POLICY0 = "/sys/devices/system/cpu/cpufreq/policy0/"


def run(args, capsys, check_mode=False):
    with patch_module_args(dict(args, _ansible_check_mode=check_mode, _ansible_diff=True)):
        with pytest.raises(SystemExit):
            kernel_setting.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture(name="tree")
def fixture_tree(tmp_path):
    def make(name):
        root = tmp_path / name
        shutil.copytree(os.path.join(TUNING, name), root)
        return root
    return make


def state_of(tmp_path):
    return json.loads((tmp_path / "state.json").read_text())


def test_thp_written_and_original_recorded(tree, tmp_path, capsys):
    root = tree("xeon-spr")
    args = {"path": THP_ENABLED, "value": "never", "sysroot": str(root), "state_key": "thp.enabled",
            "state_path": str(tmp_path / "state.json")}
    result = run(args, capsys)
    assert (result["changed"], result["applied"], result["before"]) == (True, True, "madvise")
    assert result["choices"] == ["always", "madvise", "never"]
    assert result["diff"] == {"before": THP_ENABLED + ": madvise\n", "after": THP_ENABLED + ": never\n"}
    assert (root / THP_ENABLED.lstrip("/")).read_text() == "never"
    assert state_of(tmp_path)["settings"]["thp.enabled"]["original"] == "always [madvise] never"
    # the kernel shows the new choice bracketed; the next run changes nothing
    (root / THP_ENABLED.lstrip("/")).write_text("always madvise [never]\n")
    again = run(args, capsys)
    assert (again["changed"], again["applied"], again["original_recorded"]) == (False, True, False)


def test_original_kept_across_changes(tree, tmp_path, capsys):
    root = tree("xeon-spr")
    args = {"path": "/proc/sys/vm/swappiness", "sysroot": str(root), "state_key": "swap.swappiness",
            "state_path": str(tmp_path / "state.json")}
    run(dict(args, value="10"), capsys)
    run(dict(args, value="1"), capsys)
    assert (root / "proc/sys/vm/swappiness").read_text() == "1"
    assert state_of(tmp_path)["settings"]["swap.swappiness"]["original"] == "60"


def test_value_not_in_bracketed_choices_fails_unchanged(tree, tmp_path, capsys):
    root = tree("xeon-spr")
    result = run({"path": "/sys/kernel/mm/transparent_hugepage/defrag", "value": "sometimes",
                  "sysroot": str(root), "state_key": "thp.defrag", "state_path": str(tmp_path / "state.json")}, capsys)
    assert result["failed"] is True
    assert result["msg"] == ("/sys/kernel/mm/transparent_hugepage/defrag: value 'sometimes' is not offered by the "
                             "kernel; allowed: always, defer, defer+madvise, madvise, never")
    assert (root / "sys/kernel/mm/transparent_hugepage/defrag").read_text() == \
        "always defer defer+madvise [madvise] never\n"
    assert not (tmp_path / "state.json").exists()


def test_governor_validated_against_intel_pstate_list(tree, tmp_path, capsys):
    root = tree("xeon-spr")
    args = {"path": POLICY0 + "scaling_governor", "choices_path": POLICY0 + "scaling_available_governors",
            "sysroot": str(root), "state_path": str(tmp_path / "state.json")}
    refused = run(dict(args, value="schedutil"), capsys)
    assert refused["msg"].endswith("value 'schedutil' is not offered by the kernel; allowed: performance, powersave")
    done = run(dict(args, value="performance"), capsys)
    assert (done["changed"], done["before"], done["after"]) == (True, "powersave", "performance")


def test_absent_file_is_not_a_failure(tree, tmp_path, capsys):
    root = tree("epyc-acpi")
    result = run({"path": POLICY0 + "energy_performance_preference", "value": "performance",
                  "choices_path": POLICY0 + "energy_performance_available_preferences", "sysroot": str(root),
                  "state_key": "cpufreq.policy0.energy_performance_preference",
                  "state_path": str(tmp_path / "state.json")}, capsys)
    assert result == {"changed": False, "applied": False, "original_recorded": False,
                      "reason": POLICY0 + "energy_performance_preference not present", "invocation": result["invocation"]}


def test_check_mode_changes_nothing(tree, tmp_path, capsys):
    root = tree("epyc-acpi")
    result = run({"path": "/sys/devices/system/cpu/cpufreq/boost", "value": "1", "sysroot": str(root),
                  "state_key": "cpufreq.boost", "state_path": str(tmp_path / "state.json")}, capsys, check_mode=True)
    assert (result["changed"], result["applied"], result["original_recorded"]) == (True, True, True)
    assert (root / "sys/devices/system/cpu/cpufreq/boost").read_text() == "0\n"
    assert not (tmp_path / "state.json").exists()


def test_read_only_sysfs_attribute(tmp_path, capsys):
    # hpage_pmd_size has no store method: the kernel refuses any write (EACCES), even as root
    path = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"
    if not os.path.exists(path):
        pytest.skip("kernel without THP")
    result = run({"path": path, "value": "4096", "state_key": "test.hpage_pmd_size",
                  "state_path": str(tmp_path / "state.json")}, capsys)
    assert (result["changed"], result["applied"]) == (False, False)
    assert result["reason"].startswith("read-only: %s (" % path)
    assert not (tmp_path / "state.json").exists()


def test_kernel_path_recorded_and_original_text_written_back(tree, tmp_path, capsys):
    # what playbooks/rollback.yml does: the recorded text goes back as the value
    root = tree("xeon-spr")
    args = {"path": THP_ENABLED, "sysroot": str(root), "state_path": str(tmp_path / "state.json")}
    run(dict(args, value="never", state_key="thp.enabled"), capsys)
    entry = state_of(tmp_path)["settings"]["thp.enabled"]
    assert (entry["original"], entry["kernel_path"]) == ("always [madvise] never", THP_ENABLED)
    (root / THP_ENABLED.lstrip("/")).write_text("always madvise [never]\n")
    back = run(dict(args, value=entry["original"]), capsys)
    assert (back["changed"], back["before"], back["after"]) == (True, "never", "madvise")
    assert (root / THP_ENABLED.lstrip("/")).read_text() == "madvise"
