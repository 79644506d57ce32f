"""Tests of module_utils/llmtune_cmdline.py and library/kernel_cmdline.py on real grub defaults files.

The fixture trees under tests/fixtures/grub/<host>/ are laid out as on the host (etc/default/grub,
etc/default/grub.d/*.cfg, proc/cmdline); each test edits a copy in tmp_path.
"""

import functools
import json
import os
import re
import subprocess

import pytest
from ansible.module_utils.llmtune_cmdline import (
    CmdlineError, edit_params, evaluate_dropins, join_params, missing_params, parse_shell_word,
    replace_assignment, split_kernel_params)
from ansible.module_utils.common import warnings
from ansible.module_utils.testing import patch_module_args

import kernel_cmdline
from conftest import copy_tree

TUNING = {"intel_idle.max_cstate": 1, "processor.max_cstate": 1, "transparent_hugepage": "madvise"}


@pytest.fixture
def host(tmp_path):
    """Return a function copying fixture tree NAME to tmp_path and returning its root."""
    return functools.partial(copy_tree, tmp_path, "grub")


def run(capsys, root, check=False, **args):
    """Run the module on the tree ``root``; return its JSON result (dict)."""
    args.setdefault("path", str(root / "etc/default/grub"))
    args.setdefault("running_cmdline", str(root / "proc/cmdline"))
    args.update(_ansible_check_mode=check, _ansible_diff=True)
    # AnsibleModule collects warnings per process; each run here stands for one module process.
    warnings._global_warnings.clear()
    with patch_module_args(args), pytest.raises(SystemExit):
        kernel_cmdline.main()
    result = json.loads(capsys.readouterr().out)
    if "warnings" in result:
        result["warnings"] = [warning["event"]["msg"] for warning in result["warnings"]]
    return result


def changed_lines(before, after):
    """Lines that differ between two texts of the same line count, as (old, new) pairs."""
    old, new = before.splitlines(True), after.splitlines(True)
    assert len(old) == len(new)
    return [(a, b) for a, b in zip(old, new) if a != b]


# --- shell words -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, value, quote", [
    ('"quiet splash"', "quiet splash", '"'),
    ("'console=ttyS0,19200n8 net.ifnames=0'  # serial", "console=ttyS0,19200n8 net.ifnames=0", "'"),
    ("quiet # comment", "quiet", ""),
    ('""', "", '"'),
    ("", "", ""),
    (r'"a\"b \$HOME \x"', r'a"b $HOME \x', ""),
    ("'$literal'", "$literal", "'"),
    (r"a\ b", "a b", ""),
])
def test_shell_word_literal_values(text, value, quote):
    word = parse_shell_word(text)
    assert (word.expand({}), word.quote, word.variables, word.command) == (value, quote, [], False)


def test_shell_word_expansions_and_command_substitution():
    word = parse_shell_word('"$GRUB_CMDLINE_LINUX ${EXTRA} console=ttyS1"')
    assert word.variables == ["GRUB_CMDLINE_LINUX", "EXTRA"]
    assert word.expand({"GRUB_CMDLINE_LINUX": "quiet"}) == "quiet  console=ttyS1"
    assert parse_shell_word("\"$(sed 's, release .*$,,g' /etc/system-release)\"").command is True
    assert parse_shell_word("`lsb_release -i -s`").command is True


@pytest.mark.parametrize("text, message", [
    ('"quiet splash', "unbalanced double quote"),
    ("'quiet", "unbalanced single quote"),
    ('"${X:-quiet}"', "unsupported parameter expansion"),
])
def test_shell_word_refusals(text, message):
    with pytest.raises(CmdlineError, match=message):
        parse_shell_word(text)


# --- kernel parameters -------------------------------------------------------------------------

def test_split_proc_cmdline_stops_at_init_arguments():
    cmdline = ('mitigations=auto,no_guest_host console=ttyS0 quiet reboot=k rdinit=/process_api '
               '-- --firecracker-init --addr 0.0.0.0:2024')
    params = split_kernel_params(cmdline)
    assert [(p.name, p.value) for p in params] == [
        ("mitigations", "auto,no_guest_host"), ("console", "ttyS0"), ("quiet", None), ("reboot", "k"),
        ("rdinit", "/process_api")]


def test_split_keeps_kernel_quotes_and_first_equals():
    params = split_kernel_params(' acpi_osi="!Windows 2012"  root=UUID=0b6f-1a4e dyndbg="file x.c +p" ')
    assert [(p.name, p.value, p.raw) for p in params] == [
        ("acpi_osi", "!Windows 2012", 'acpi_osi="!Windows 2012"'),
        ("root", "UUID=0b6f-1a4e", "root=UUID=0b6f-1a4e"),
        ("dyndbg", "file x.c +p", 'dyndbg="file x.c +p"')]
    with pytest.raises(CmdlineError, match="unbalanced double quote"):
        split_kernel_params('acpi_osi="!Windows')


def test_edit_replaces_in_place_and_never_duplicates():
    old = split_kernel_params("quiet intel_idle.max_cstate=0 console=tty0 console=ttyS0 "
                              "intel_idle.max_cstate=2 splash")
    new = edit_params(old, {"intel_idle.max_cstate": 1, "nosmt": None}, ["splash"])
    assert join_params(new) == "quiet intel_idle.max_cstate=1 console=tty0 console=ttyS0 nosmt"


def test_edit_equal_set_in_other_order_is_unchanged():
    old = split_kernel_params("transparent_hugepage=madvise rhgb processor.max_cstate=1 intel_idle.max_cstate=1")
    new = edit_params(old, TUNING, [])
    assert [p.raw for p in new] == [p.raw for p in old]


def test_edit_dash_and_underscore_are_one_name():
    old = split_kernel_params("intel-idle.max-cstate=0 quiet")
    assert join_params(edit_params(old, {"intel_idle.max_cstate": 1}, [])) == "intel_idle.max_cstate=1 quiet"
    assert join_params(edit_params(old, {}, ["intel_idle.max_cstate"])) == "quiet"


@pytest.mark.parametrize("wanted, remove, message", [
    ({"mitigations": False}, [], "is a boolean"),
    ({"bad name": 1}, [], "invalid kernel parameter name"),
    ({"acpi_osi": 'say "hi"'}, [], "double quote"),
    ({"quiet": None}, ["quiet"], "both set and removed: quiet"),
])
def test_edit_refuses_bad_parameters(wanted, remove, message):
    with pytest.raises(CmdlineError, match=message):
        edit_params([], wanted, remove)


def test_missing_params_last_copy_wins_and_order_does_not_matter():
    running = "BOOT_IMAGE=/vmlinuz ro transparent_hugepage=madvise intel_idle.max_cstate=0 quiet intel_idle.max_cstate=1"
    assert missing_params(running, TUNING, ["quiet", "splash"]) == ["processor.max_cstate=1", "-quiet"]
    assert missing_params("processor.max_cstate=1 intel_idle.max_cstate=1 transparent_hugepage=madvise",
                          TUNING, []) == []


def test_evaluate_dropins_follows_self_expansion_and_overrides(host):
    root = host("debian12-dropins")
    dropins = [(str(p), p.read_text()) for p in sorted((root / "etc/default/grub.d").glob("*.cfg"))]
    values, assigned_by = evaluate_dropins({"GRUB_CMDLINE_LINUX": "nosmt", "GRUB_CMDLINE_LINUX_DEFAULT": "quiet"},
                                           dropins[:1])
    assert values == {"GRUB_CMDLINE_LINUX": "nosmt console=ttyS1,115200n8", "GRUB_CMDLINE_LINUX_DEFAULT": "quiet"}
    assert assigned_by == {"GRUB_CMDLINE_LINUX": dropins[0][0]}
    values, assigned_by = evaluate_dropins(values, dropins[1:])
    assert values["GRUB_CMDLINE_LINUX"] == "intel_idle.max_cstate=0 processor.max_cstate=0"
    assert assigned_by["GRUB_CMDLINE_LINUX"].endswith("99-old-tuning.cfg")


# --- editing files -----------------------------------------------------------------------------

def test_replace_appends_missing_variable_and_keeps_file():
    text = "GRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT=\"quiet\""
    assert replace_assignment(text, "GRUB_CMDLINE_LINUX", "nosmt", "f") == text + '\nGRUB_CMDLINE_LINUX="nosmt"\n'


def test_debian_empty_value_gets_parameters_and_nothing_else_changes(host, capsys):
    root = host("debian12")
    grub = root / "etc/default/grub"
    original = grub.read_bytes()
    result = run(capsys, root, set=TUNING)
    assert result["changed"] is True
    assert result["before"] == ""
    assert result["after"] == "intel_idle.max_cstate=1 processor.max_cstate=1 transparent_hugepage=madvise"
    assert changed_lines(original.decode(), grub.read_text()) == [(
        'GRUB_CMDLINE_LINUX=""\n',
        'GRUB_CMDLINE_LINUX="intel_idle.max_cstate=1 processor.max_cstate=1 transparent_hugepage=madvise"\n')]
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n' in grub.read_text()
    assert result["cmdline"] == "intel_idle.max_cstate=1 processor.max_cstate=1 transparent_hugepage=madvise quiet"
    assert result["pending"] == ["intel_idle.max_cstate=1", "processor.max_cstate=1", "transparent_hugepage=madvise"]
    assert result["diff"]["before"] == original.decode()
    assert result["params_set"] == ["intel_idle.max_cstate=1", "processor.max_cstate=1", "transparent_hugepage=madvise"]
    assert result["overridden_by"] == [] and "warnings" not in result

    again = run(capsys, root, set=dict(reversed(list(TUNING.items()))))
    assert again["changed"] is False and "diff" not in again


def test_check_mode_reports_the_edit_and_writes_nothing(host, capsys):
    root = host("debian12")
    grub = root / "etc/default/grub"
    original = grub.read_bytes()
    result = run(capsys, root, check=True, set={"nosmt": None})
    assert result["changed"] is True
    assert changed_lines(result["diff"]["before"], result["diff"]["after"]) == [
        ('GRUB_CMDLINE_LINUX=""\n', 'GRUB_CMDLINE_LINUX="nosmt"\n')]
    assert grub.read_bytes() == original


def test_default_variable_on_debian_keeps_quiet(host, capsys):
    root = host("debian12")
    result = run(capsys, root, variable="GRUB_CMDLINE_LINUX_DEFAULT", set={"nosoftlockup": None})
    assert (result["before"], result["after"]) == ("quiet", "quiet nosoftlockup")
    assert 'GRUB_CMDLINE_LINUX=""\n' in (root / "etc/default/grub").read_text()


@pytest.mark.parametrize("name", ["rhel7", "rhel8", "rhel9"])
def test_rhel_value_replaced_in_place_with_distributor_command_substitution_left_alone(host, capsys, name):
    root = host(name)
    grub = root / "etc/default/grub"
    grub.write_text(grub.read_text().replace(" rhgb quiet", " intel_idle.max_cstate=0 rhgb quiet"))
    original = grub.read_text()
    result = run(capsys, root, set={"intel_idle.max_cstate": 1}, remove=["rhgb"], backup=True)
    assert result["after"] == result["before"].replace("max_cstate=0 rhgb", "max_cstate=1")
    [(old, new)] = changed_lines(original, grub.read_text())
    assert new == old.replace("max_cstate=0 rhgb", "max_cstate=1")
    with open(result["backup_file"]) as handle:
        assert handle.read() == original
    assert run(capsys, root, set={"intel_idle.max_cstate": 1}, remove=["rhgb"])["changed"] is False


def test_rhel9_pending_compares_with_proc_cmdline(host, capsys):
    root = host("rhel9")
    result = run(capsys, root, check=True, set={"intel_idle.max_cstate": 1, "processor.max_cstate": 1},
                 remove=["rhgb", "splash"])
    assert result["pending"] == ["processor.max_cstate=1", "-rhgb"]


def test_single_quoted_value_keeps_its_quotes_and_comment(host, capsys):
    root = host("debian-serial-single-quoted")
    original = (root / "etc/default/grub").read_text()
    run(capsys, root, set={"net.ifnames": 1, "processor.max_cstate": 1}, remove=["swapaccount"])
    assert changed_lines(original, (root / "etc/default/grub").read_text()) == [(
        "GRUB_CMDLINE_LINUX='console=ttyS0,19200n8 net.ifnames=0 cgroup_enable=memory swapaccount=1'"
        "  # serial console\n",
        "GRUB_CMDLINE_LINUX='console=ttyS0,19200n8 net.ifnames=1 cgroup_enable=memory processor.max_cstate=1'"
        "  # serial console\n")]


def test_ubuntu_cloud_dropin_overrides_linux_default(host, capsys):
    root = host("ubuntu2204-cloud")
    result = run(capsys, root, variable="GRUB_CMDLINE_LINUX_DEFAULT", set={"transparent_hugepage": "madvise"})
    dropin = str(root / "etc/default/grub.d/50-cloudimg-settings.cfg")
    assert result["changed"] is True and result["after"] == "quiet splash transparent_hugepage=madvise"
    assert result["effective"]["GRUB_CMDLINE_LINUX_DEFAULT"] == "console=tty1 console=ttyS0"
    assert result["overridden_by"] == [dropin]
    assert result["warnings"] == [
        "%s overrides GRUB_CMDLINE_LINUX_DEFAULT of %s: grub will use 'console=tty1 console=ttyS0', which "
        "lacks transparent_hugepage=madvise" % (dropin, root / "etc/default/grub")]


def test_ubuntu_cloud_linux_is_not_overridden(host, capsys):
    root = host("ubuntu2204-cloud")
    result = run(capsys, root, set={"transparent_hugepage": "madvise"})
    assert result["overridden_by"] == [] and "warnings" not in result
    assert result["cmdline"] == "transparent_hugepage=madvise console=tty1 console=ttyS0"
    assert result["pending"] == ["transparent_hugepage=madvise"]


def test_dropin_resetting_linux_is_reported(host, capsys):
    root = host("debian12-dropins")
    result = run(capsys, root, set={"intel_idle.max_cstate": 1, "nosmt": None})
    assert result["changed"] is True
    assert result["overridden_by"] == [str(root / "etc/default/grub.d/99-old-tuning.cfg")]
    assert result["effective"]["GRUB_CMDLINE_LINUX"] == "intel_idle.max_cstate=0 processor.max_cstate=0"
    assert result["warnings"][0].endswith("which lacks intel_idle.max_cstate=1 nosmt")


def test_other_variable_with_a_later_copy_is_reported(host, capsys):
    root = host("debian12")
    grub = root / "etc/default/grub"
    grub.write_text(grub.read_text().replace('DEFAULT="quiet"', 'DEFAULT="quiet intel_idle.max_cstate=0"'))
    result = run(capsys, root, set={"intel_idle.max_cstate": 1})
    assert result["overridden_by"] == [str(grub)]
    assert result["warnings"] == ["GRUB_CMDLINE_LINUX_DEFAULT in %s conflicts with the edit: the normal entries "
                                  "would lack intel_idle.max_cstate=1" % grub]


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('GRUB_CMDLINE_LINUX=""', 'GRUB_CMDLINE_LINUX="quiet'),
     r'/grub:10: GRUB_CMDLINE_LINUX="quiet: quote not closed on its line \(bash -n: line \d+: unexpected EOF'),
    (lambda t: t.replace('GRUB_CMDLINE_LINUX=""', 'GRUB_CMDLINE_LINUX="$(cat /etc/cmdline)"'),
     r"/grub:10: .* command substitution"),
    (lambda t: t.replace('GRUB_CMDLINE_LINUX=""', 'GRUB_CMDLINE_LINUX="$EXTRA quiet"'),
     r"/grub:10: .* expands \$EXTRA"),
    (lambda t: t.replace('GRUB_CMDLINE_LINUX=""', 'GRUB_CMDLINE_LINUX="" ; GRUB_CMDLINE_LINUX=x'),
     r"/grub:10: .* another command follows"),
])
def test_unsafe_files_are_refused_and_left_unchanged(host, capsys, edit, message):
    root = host("debian12")
    grub = root / "etc/default/grub"
    grub.write_text(edit(grub.read_text()))
    original = grub.read_bytes()
    result = run(capsys, root, set={"nosmt": None})
    assert result["failed"] is True
    assert re.search(message, result["msg"]), result["msg"]
    assert grub.read_bytes() == original


def test_missing_file_fails_with_one_line(tmp_path, capsys):
    result = run(capsys, tmp_path, path=str(tmp_path / "grub"), set={"nosmt": None})
    assert result["msg"] == "%s does not exist or is not a regular file" % (tmp_path / "grub")


def test_non_utf8_bytes_elsewhere_survive(host, capsys):
    root = host("debian12")
    grub = root / "etc/default/grub"
    grub.write_bytes(grub.read_bytes().replace(b"# If you change", b"# \xe9t\xe9 If you change"))
    original = grub.read_bytes()
    run(capsys, root, set={"nosmt": None})
    assert grub.read_bytes() == original.replace(b'GRUB_CMDLINE_LINUX=""', b'GRUB_CMDLINE_LINUX="nosmt"')


# --- repeated assignments (issue 17, input 1) and files the shell cannot source ------------------

ZFS_LINE = 'GRUB_CMDLINE_LINUX="root=ZFS=rpool/ROOT/pve-1 console=tty0 iommu=pt nmi_watchdog=0"'
ZFS_VALUE = "root=ZFS=rpool/ROOT/pve-1 console=tty0 iommu=pt nmi_watchdog=0"


def bash_accepts(path):
    """True when bash -n accepts the file, as the module's check does."""
    return subprocess.run(["bash", "-n", str(path)], capture_output=True, check=False).returncode == 0


def backups(root):
    """Backup copies AnsibleModule.backup_local left next to the grub defaults file."""
    return sorted(p.name for p in (root / "etc/default").iterdir() if p.name.startswith("grub.") and p.is_file())


def test_proxmox_zfs_duplicate_lines_3_and_4_are_merged_once(host, capsys):
    root = host("proxmox-zfs-duplicate")
    grub = root / "etc/default/grub"
    original = grub.read_text()
    assert original.splitlines()[2:4] == [ZFS_LINE, ZFS_LINE]
    result = run(capsys, root, set=TUNING)
    assert result["changed"] is True
    assert result["merged"] == ["%s:3: %s" % (grub, ZFS_LINE)]
    assert result["before"] == ZFS_VALUE
    assert result["after"] == ZFS_VALUE + " intel_idle.max_cstate=1 processor.max_cstate=1 transparent_hugepage=madvise"
    assert grub.read_text().splitlines() == [
        "GRUB_DEFAULT=0", "GRUB_TIMEOUT=5",
        'GRUB_CMDLINE_LINUX="%s"' % result["after"],
        'GRUB_DISTRIBUTOR="Proxmox VE"', 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"']
    assert bash_accepts(grub)
    with open(result["backup_file"]) as handle:
        assert handle.read() == original
    assert result["warnings"] == ["GRUB_CMDLINE_LINUX is assigned 2 times; merged into %s:4 (the value the shell "
                                  "ends with), removing %s:3" % (grub, grub)]
    assert result["pending"] == ["intel_idle.max_cstate=1", "processor.max_cstate=1", "transparent_hugepage=madvise"]

    again = run(capsys, root, set=TUNING)
    assert (again["changed"], again["merged"], "backup_file" in again) == (False, [], False)
    assert backups(root) == [os.path.basename(result["backup_file"])]


def test_duplicates_are_merged_even_when_the_parameters_are_already_there(host, capsys):
    root = host("proxmox-zfs-duplicate")
    grub = root / "etc/default/grub"
    result = run(capsys, root, set={"iommu": "pt"})
    assert (result["changed"], result["before"], result["after"]) == (True, ZFS_VALUE, ZFS_VALUE)
    assert grub.read_text().count("GRUB_CMDLINE_LINUX=") == 1 and ZFS_LINE in grub.read_text()
    assert len(backups(root)) == 1


def test_duplicate_merge_in_check_mode_writes_nothing(host, capsys):
    root = host("proxmox-zfs-duplicate")
    grub = root / "etc/default/grub"
    original = grub.read_bytes()
    result = run(capsys, root, check=True, set={"nosmt": None})
    assert result["changed"] is True and result["merged"] == ["%s:3: %s" % (grub, ZFS_LINE)]
    assert result["diff"]["after"].count("GRUB_CMDLINE_LINUX=") == 1
    assert grub.read_bytes() == original and backups(root) == [] and "backup_file" not in result


@pytest.mark.parametrize("line4, before", [
    # different values: the last assignment is what the shell ends with
    ('GRUB_CMDLINE_LINUX="root=ZFS=rpool/ROOT/pve-1 boot=zfs"', "root=ZFS=rpool/ROOT/pve-1 boot=zfs"),
    # unquoted and single-quoted forms of the later assignment
    ("GRUB_CMDLINE_LINUX=root=ZFS=rpool/ROOT/pve-1", "root=ZFS=rpool/ROOT/pve-1"),
    ("export GRUB_CMDLINE_LINUX='nosmt'  # added later", "nosmt"),
    # the later one appends to the earlier value
    ('GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX boot=zfs"', ZFS_VALUE + " boot=zfs"),
    ('GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} boot=zfs"', ZFS_VALUE + " boot=zfs"),
])
def test_different_duplicates_keep_the_value_the_shell_ends_with(host, capsys, line4, before):
    root = host("proxmox-zfs-duplicate")
    grub = root / "etc/default/grub"
    lines = grub.read_text().splitlines(True)
    lines[3] = line4 + "\n"
    grub.write_text("".join(lines))
    shell = subprocess.run(["bash", "-c", '. "$1"; printf %s "$GRUB_CMDLINE_LINUX"', "-", str(grub)],
                           capture_output=True, text=True, check=True).stdout
    assert shell == before
    result = run(capsys, root, set={"nosmt": None})
    assert result["before"] == before and result["merged"] == ["%s:3: %s" % (grub, ZFS_LINE)]
    assert result["after"] == (before if "nosmt" in before.split() else before + " nosmt")
    new = grub.read_text().splitlines()
    assert [line for line in new if "GRUB_CMDLINE_LINUX=" in line] == [
        line4[:line4.index("=") + 1] + ("'%s'" % result["after"] if "'" in line4 else '"%s"' % result["after"])
        + ("  # added later" if "#" in line4 else "")]
    assert new.index([line for line in new if "GRUB_CMDLINE_LINUX=" in line][0]) == 2
    assert bash_accepts(grub)
    assert run(capsys, root, set={"nosmt": None})["changed"] is False


def test_three_assignments_the_middle_one_appending(host, capsys):
    root = host("proxmox-zfs-duplicate")
    grub = root / "etc/default/grub"
    lines = grub.read_text().splitlines(True)
    lines[3] = 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX boot=zfs"\n'
    lines.insert(4, 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} quiet"\n')
    grub.write_text("".join(lines))
    result = run(capsys, root, set={"nosmt": None})
    assert result["before"] == ZFS_VALUE + " boot=zfs quiet"
    assert result["merged"] == ["%s:3: %s" % (grub, ZFS_LINE),
                                '%s:4: GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX boot=zfs"' % grub]
    assert grub.read_text().splitlines()[2] == 'GRUB_CMDLINE_LINUX="%s boot=zfs quiet nosmt"' % ZFS_VALUE
    assert bash_accepts(grub)


def test_dropin_assignment_is_read_not_merged(host, capsys):
    root = host("proxmox-zfs-duplicate")
    dropin = root / "etc/default/grub.d/zfs.cfg"
    dropin.parent.mkdir()
    dropin.write_text('GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX boot=zfs"\n')
    result = run(capsys, root, set={"nosmt": None})
    assert result["merged"] == ["%s:3: %s" % (root / "etc/default/grub", ZFS_LINE)]
    assert dropin.read_text() == 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX boot=zfs"\n'
    assert result["effective"]["GRUB_CMDLINE_LINUX"] == ZFS_VALUE + " nosmt boot=zfs"
    assert result["overridden_by"] == []


@pytest.mark.parametrize("between, message", [
    ('if [ -e /etc/pve ]; then GRUB_TIMEOUT=3; fi',
     r"grub:4: if \[ -e /etc/pve \]; then GRUB_TIMEOUT=3; fi: not a plain assignment, between two assignments "
     r"of GRUB_CMDLINE_LINUX; merge them by hand"),
    ('GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX quiet"',
     r"grub:4: .*: reads \$GRUB_CMDLINE_LINUX between two of its assignments; merge them by hand"),
])
def test_duplicates_with_something_between_that_a_merge_would_change_are_refused(host, capsys, between, message):
    root = host("proxmox-zfs-duplicate")
    grub = root / "etc/default/grub"
    lines = grub.read_text().splitlines(True)
    grub.write_text("".join(lines[:3] + [between + "\n"] + lines[3:]))
    original = grub.read_bytes()
    result = run(capsys, root, set={"nosmt": None})
    assert result["failed"] is True and re.search(message, result["msg"]), result["msg"]
    assert grub.read_bytes() == original and backups(root) == []


@pytest.mark.parametrize("number, broken, text", [
    # the issue's line 3 without its closing quote: bash pairs it with line 4's and complains at line 6
    (3, ZFS_LINE[:-1], r"quote not closed on its line \(bash -n: line 6: unexpected EOF"),
    (5, "GRUB_DISTRIBUTOR='Proxmox VE", r"quote not closed on its line \(bash -n: line 5: unexpected EOF"),
])
def test_unterminated_quote_is_refused_naming_its_line_and_left_untouched(host, capsys, number, broken, text):
    root = host("proxmox-zfs-duplicate")
    grub = root / "etc/default/grub"
    lines = grub.read_text().splitlines(True)
    lines[number - 1] = broken + "\n"
    grub.write_text("".join(lines))
    original = grub.read_bytes()
    assert not bash_accepts(grub)
    for check in (True, False):
        result = run(capsys, root, check=check, set={"nosmt": None})
        assert result["failed"] is True
        assert re.match(r"%s:%d: %s: %s" % (re.escape(str(grub)), number, re.escape(broken), text),
                        result["msg"]), result["msg"]
        assert result["msg"].endswith("nothing changed: the shell cannot source %s as it is" % grub)
        assert grub.read_bytes() == original and backups(root) == []


def test_dropin_the_shell_cannot_source_is_refused(host, capsys):
    root = host("debian12-dropins")
    dropin = root / "etc/default/grub.d/10-serial.cfg"
    dropin.write_text(dropin.read_text() + "if true; then\n")
    grub = root / "etc/default/grub"
    original = grub.read_bytes()
    result = run(capsys, root, set={"nosmt": None})
    assert result["failed"] is True
    assert result["msg"].startswith("%s:%d: (end of file): bash -n: syntax error: unexpected end of file"
                                    % (dropin, len(dropin.read_text().splitlines()) + 1)), result["msg"]
    assert grub.read_bytes() == original


def test_new_text_bash_rejects_is_never_written(host, capsys, monkeypatch):
    root = host("proxmox-zfs-duplicate")
    grub = root / "etc/default/grub"
    original = grub.read_bytes()
    # stands for an edit gone wrong: the module must check what it is about to write
    monkeypatch.setattr(kernel_cmdline, "replace_assignment", lambda text, *args: text + "GRUB_X='broken\n")
    result = run(capsys, root, set={"nosmt": None})
    assert result["failed"] is True
    assert result["msg"].startswith("refusing to write %s, nothing changed: the new text would not pass bash -n "
                                    "(%s:7: GRUB_X='broken: quote not closed on its line" % (grub, grub)), result["msg"]
    assert grub.read_bytes() == original and backups(root) == []
    assert [p for p in (root / "etc/default").iterdir() if p.name.startswith(".kernel_cmdline.")] == []
