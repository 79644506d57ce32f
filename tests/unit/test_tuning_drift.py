"""tuning_drift module: wanted tuning against fixture sysroots laid out like real machines."""

import functools
import json
import os
import shutil

import kernel_cmdline
import pytest
import tuning_drift
from conftest import FIXTURES, copy_tree

from ansible.module_utils.llmtune_sysfs import comment_fstab_swap
from ansible.module_utils.testing import patch_module_args

THP = "/sys/kernel/mm/transparent_hugepage/"


def run(args, capsys):
    with patch_module_args(dict(args, _ansible_check_mode=True)):
        with pytest.raises(SystemExit):
            tuning_drift.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture(name="tree")
def fixture_tree(tmp_path):
    def make(name, status=None):
        root = tmp_path / name
        shutil.copytree(os.path.join(FIXTURES, "tuning", name), root)
        if status:
            (root / "proc" / "self").mkdir(parents=True)
            shutil.copy(os.path.join(FIXTURES, "drift", status), root / "proc" / "self" / "status")
        return root
    return make


def by_setting(result):
    return {row["setting"]: (row["actual"], row["status"], row["reason"]) for row in result["rows"]}


def test_runtime_values_ok_and_drift(tree, capsys):
    root = tree("xeon-spr")
    settings = [{"key": "thp.enabled", "path": THP + "enabled", "value": "madvise"},
                {"key": "thp.defrag", "path": THP + "defrag", "value": "never"},
                {"key": "swap.swappiness", "path": "/proc/sys/vm/swappiness", "value": "1"}]
    result = run({"settings": settings, "sysroot": str(root)}, capsys)
    assert result["changed"] is False
    assert by_setting(result) == {"thp.enabled": ("madvise", "ok", ""), "thp.defrag": ("madvise", "drift", ""),
                                  "swap.swappiness": ("60", "drift", "")}
    assert result["drift"] == ["thp.defrag", "swap.swappiness"]


def test_recorded_original_text_compares_as_its_bracketed_word(tree, capsys):
    root = tree("xeon-spr")
    result = run({"settings": [{"key": "thp.enabled", "path": THP + "enabled", "value": "always [madvise] never"}],
                  "sysroot": str(root)}, capsys)
    assert [(r["wanted"], r["status"]) for r in result["rows"]] == [("madvise", "ok")]


def test_missing_interface_is_not_applicable(tree, capsys):
    root = tree("graviton3")
    result = run({"settings": [{"key": "numa.numa_balancing", "path": "/proc/sys/kernel/numa_balancing",
                                "value": "0"}], "sysroot": str(root)}, capsys)
    assert by_setting(result) == {
        "numa.numa_balancing": ("-", "n/a", "/proc/sys/kernel/numa_balancing not present")}
    assert result["drift"] == []


def test_active_swap_drifts_where_swapoff_is_permitted(tree, capsys):
    root = tree("xeon-spr", "status-root")
    result = run({"swap_off": True, "sysroot": str(root)}, capsys)
    assert by_setting(result) == {"swap.active": ("/swap.img /dev/zram0", "drift", "")}


def test_active_swap_not_applicable_without_cap_sys_admin(tree, capsys):
    root = tree("xeon-spr", "status-podman")
    result = run({"swap_off": True, "sysroot": str(root)}, capsys)
    assert by_setting(result) == {"swap.active": (
        "/swap.img /dev/zram0", "n/a", "swapoff not permitted (no CAP_SYS_ADMIN, e.g. a container)")}


def test_no_active_swap_is_ok(tree, capsys):
    root = tree("graviton3", "status-podman")
    assert by_setting(run({"swap_off": True, "sysroot": str(root)}, capsys)) == {"swap.active": ("none", "ok", "")}


def test_fstab_swap_line_is_drift_until_commented(tree, capsys):
    root = tree("graviton3")
    fstab = root / "etc" / "fstab"
    fstab.parent.mkdir()
    shutil.copy(os.path.join(FIXTURES, "tuning", "fstab", "debian-installer"), fstab)
    line = "UUID=0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0 none            swap    sw              0       0"
    assert by_setting(run({"fstab": "/etc/fstab", "sysroot": str(root)}, capsys)) == {
        "swap.fstab": (line, "drift", "")}
    fstab.write_text(comment_fstab_swap(fstab.read_text())[0])
    assert by_setting(run({"fstab": "/etc/fstab", "sysroot": str(root)}, capsys)) == {"swap.fstab": ("none", "ok", "")}


def test_files_compared_byte_for_byte(tmp_path, capsys):
    etc = tmp_path / "etc" / "sysctl.d"
    etc.mkdir(parents=True)
    wanted = "# Ansible managed\nvm.swappiness = 1\n"
    (etc / "90-llmtune-swap.conf").write_text(wanted)
    (etc / "90-llmtune-numa.conf").write_text("# Ansible managed\nkernel.numa_balancing = 1\n")
    (etc / "short.conf").write_text("# Ansible managed\n")
    result = run({"sysroot": str(tmp_path), "files": [
        {"name": "swap.sysctl_file", "path": "/etc/sysctl.d/90-llmtune-swap.conf", "content": wanted},
        {"name": "numa.sysctl_file", "path": "/etc/sysctl.d/90-llmtune-numa.conf",
         "content": "# Ansible managed\nkernel.numa_balancing = 0\n"},
        {"name": "short", "path": "/etc/sysctl.d/short.conf", "content": wanted},
        {"name": "thp.tmpfiles", "path": "/etc/tmpfiles.d/llmtune-thp.conf", "content": "w- x\n"}]}, capsys)
    assert by_setting(result) == {
        "swap.sysctl_file": ("as templated", "ok", ""),
        "numa.sysctl_file": ("/etc/sysctl.d/90-llmtune-numa.conf line 2: kernel.numa_balancing = 1", "drift", ""),
        "short": ("/etc/sysctl.d/short.conf line 2: (end of file)", "drift", ""),
        "thp.tmpfiles": ("absent: /etc/tmpfiles.d/llmtune-thp.conf", "drift", "")}


def test_units(capsys):
    result = run({"units": [
        {"name": "cpufreq.unit", "status": {"UnitFileState": "enabled", "ActiveState": "active"}},
        {"name": "cstates.pm_qos_unit", "status": {"UnitFileState": "enabled", "ActiveState": "inactive",
                                                   "ConditionResult": "no"}},
        {"name": "stopped.unit", "status": {"UnitFileState": "enabled", "ActiveState": "inactive",
                                            "ConditionResult": "yes"}},
        {"name": "disabled.unit", "status": {"UnitFileState": "disabled", "ActiveState": "active"}}]}, capsys)
    assert by_setting(result) == {
        "cpufreq.unit": ("enabled, active", "ok", ""),
        "cstates.pm_qos_unit": ("enabled, inactive", "n/a", "enabled; skipped by its start condition on this host"),
        "stopped.unit": ("enabled, inactive", "drift", ""),
        "disabled.unit": ("disabled, active", "drift", "")}


def test_table_lists_given_rows_first_and_aligns_columns(tree, capsys):
    root = tree("xeon-spr")
    rows = [{"setting": "grub.proc_cmdline", "wanted": "nosmt", "actual": "lacks nosmt", "status": "n/a",
             "reason": "reboot pending"}]
    result = run({"rows": rows, "sysroot": str(root),
                  "settings": [{"key": "thp.enabled", "path": THP + "enabled", "value": "never"}]}, capsys)
    assert result["table"] == [
        "setting            wanted  actual       status",
        "grub.proc_cmdline  nosmt   lacks nosmt  n/a (reboot pending)",
        "thp.enabled        never   madvise      drift",
    ]


@pytest.mark.parametrize("bad", [
    {"setting": "x", "wanted": "1", "actual": "1", "status": "fine"},
    {"setting": "x", "wanted": "1", "status": "ok"},
    {"setting": "x", "wanted": "1", "actual": "-", "status": "n/a"},
])
def test_bad_rows_fail_with_one_line(bad, capsys):
    result = run({"rows": [bad]}, capsys)
    assert result["failed"] is True
    assert result["msg"] == ("bad drift row %r: needs setting, wanted, actual, status (ok, drift, pending reboot, "
                             "n/a) and a reason for n/a" % (bad,))


# --- boot parameters: configured for the next boot is not in force (issue 17, input 6) -------------------

BOOT = {"intel_idle.max_cstate": "1", "processor.max_cstate": "1", "transparent_hugepage": "madvise"}


@pytest.fixture(name="boot_tree")
def fixture_boot_tree(tmp_path):
    """Copy tests/fixtures/drift/NAME (grub defaults, /proc/cmdline, the sysfs effect files) to tmp_path."""
    return functools.partial(copy_tree, tmp_path, "drift")


def configured_cmdline(root, capsys):
    """The command line the tree's grub defaults pass at the next boot, read by kernel_cmdline unedited."""
    args = {"path": str(root / "etc/default/grub"), "running_cmdline": str(root / "proc/cmdline"),
            "_ansible_check_mode": True}
    with patch_module_args(args), pytest.raises(SystemExit):
        kernel_cmdline.main()
    return json.loads(capsys.readouterr().out)["cmdline"]


def test_boot_parameters_in_grub_defaults_but_not_booted_are_pending_reboot(boot_tree, capsys):
    root = boot_tree("boot-pending")
    configured = configured_cmdline(root, capsys)
    assert configured == "intel_idle.max_cstate=1 processor.max_cstate=1 transparent_hugepage=madvise quiet"
    result = run({"sysroot": str(root), "boot_params": {"set": BOOT, "configured": configured}}, capsys)
    assert by_setting(result) == {
        "grub.boot.intel_idle.max_cstate": (
            "/sys/module/intel_idle/parameters/max_cstate: 9, not on /proc/cmdline; the boot configuration has it",
            "pending reboot", ""),
        "grub.boot.processor.max_cstate": (
            "/sys/module/processor/parameters/max_cstate: 8, not on /proc/cmdline; the boot configuration has it",
            "pending reboot", ""),
        # the thp role wrote it at runtime: in force although the kernel did not boot with it
        "grub.boot.transparent_hugepage": ("/sys/kernel/mm/transparent_hugepage/enabled: madvise", "ok", "")}
    assert result["pending"] == ["grub.boot.intel_idle.max_cstate", "grub.boot.processor.max_cstate"]
    assert result["drift"] == []
    assert result["table"][1].endswith("pending reboot")


def test_boot_parameters_after_the_reboot_are_checked_where_the_kernel_reports_them(boot_tree, capsys):
    root = boot_tree("boot-rebooted")
    args = {"sysroot": str(root), "boot_params": {"set": BOOT, "configured": configured_cmdline(root, capsys)}}
    result = run(args, capsys)
    assert by_setting(result) == {
        "grub.boot.intel_idle.max_cstate": ("/sys/module/intel_idle/parameters/max_cstate: 1", "ok", ""),
        "grub.boot.processor.max_cstate": ("/sys/module/processor/parameters/max_cstate: 1", "ok", ""),
        "grub.boot.transparent_hugepage": ("/sys/kernel/mm/transparent_hugepage/enabled: madvise", "ok", "")}
    assert (result["drift"], result["pending"]) == ([], [])

    # on the command line but not in force where the kernel reports it: drift, not ok
    (root / "sys/kernel/mm/transparent_hugepage/enabled").write_text("[always] madvise never\n")
    (root / "sys/module/processor").rename(root / "sys/module/processor.gone")
    rows = by_setting(run(args, capsys))
    assert rows["grub.boot.transparent_hugepage"] == (
        "/sys/kernel/mm/transparent_hugepage/enabled: always although /proc/cmdline has it", "drift", "")
    assert rows["grub.boot.processor.max_cstate"] == (
        "on /proc/cmdline", "n/a",
        "/sys/module/processor/parameters/max_cstate cannot be read: module not loaded, no module parameter, "
        "or root only")


def test_boot_parameters_neither_booted_nor_configured_drift(boot_tree, capsys):
    root = boot_tree("boot-pending")
    result = run({"sysroot": str(root), "boot_params": {
        "set": {"intel_idle.max_cstate": "1", "nosmt": None}, "remove": ["quiet", "splash"],
        "configured": "intel_idle.max_cstate=2 quiet"}}, capsys)
    assert by_setting(result) == {
        "grub.boot.intel_idle.max_cstate": (
            "/sys/module/intel_idle/parameters/max_cstate: 9, not on /proc/cmdline; the boot configuration lacks it",
            "drift", ""),
        "grub.boot.nosmt": ("not on /proc/cmdline; the boot configuration lacks it", "drift", ""),
        "grub.boot.quiet": ("on /proc/cmdline and in the boot configuration", "drift", ""),
        "grub.boot.splash": ("not on /proc/cmdline", "ok", "")}
    result = run({"sysroot": str(root), "boot_params": {
        "set": {"nosmt": None}, "remove": ["quiet"], "configured": "nosmt"}}, capsys)
    assert by_setting(result) == {
        "grub.boot.nosmt": ("not on /proc/cmdline; the boot configuration has it", "pending reboot", ""),
        "grub.boot.quiet": ("on /proc/cmdline; the boot configuration drops it", "pending reboot", "")}


@pytest.mark.parametrize("sysfs, wanted, status", [("Y", None, "ok"), ("Y", "1", "ok"), ("N", "on", "pending reboot"),
                                                   ("N", "off", "ok")])
def test_bool_module_parameter_reads_y_or_n(boot_tree, capsys, sysfs, wanted, status):
    root = boot_tree("boot-pending")
    (root / "sys/module/intel_idle/parameters/use_acpi").write_text(sysfs + "\n")
    result = run({"sysroot": str(root), "boot_params": {
        "set": {"intel_idle.use_acpi": wanted},
        "configured": "intel_idle.use_acpi" + ("=" + wanted if wanted else "")}}, capsys)
    assert result["rows"][0]["status"] == status


def test_boot_parameters_in_a_container_are_not_applicable(boot_tree, capsys):
    root = boot_tree("boot-pending")
    reason = "running in a podman container, which boots no kernel of its own"
    result = run({"sysroot": str(root), "boot_params": {"set": BOOT, "configured": None, "not_applicable": reason}},
                 capsys)
    assert {r["status"] for r in result["rows"]} == {"n/a"} and {r["reason"] for r in result["rows"]} == {reason}


def test_pending_rows_from_the_caller_are_counted(capsys):
    result = run({"rows": [{"setting": "grub.boot.nosmt", "wanted": "nosmt", "actual": "not on /proc/cmdline",
                            "status": "pending reboot"}]}, capsys)
    assert (result["pending"], result["drift"]) == (["grub.boot.nosmt"], [])
    assert result["table"][1] == "grub.boot.nosmt  nosmt   not on /proc/cmdline  pending reboot"
