"""What brings swap back at boot: systemctl, dphys-swapfile and zram-generator parsers, and the swap_sources module.

systemctl output comes from tests/fixtures/tuning/systemctl (see the README there); the module runs a stand-in
systemctl that prints it, on the sysroot trees raspios-dphys and debian12-zram.
"""

import json
import os
import shutil

import pytest
from conftest import FIXTURES, read, role_module

from ansible.module_utils.llmtune_swap import (parse_shell_assignments, parse_systemctl_show, parse_systemctl_units,
                                               zram_config_settings, zram_is_swap)
from ansible.module_utils.testing import patch_module_args

TUNING = os.path.join(FIXTURES, "tuning")
SYSTEMCTL = os.path.join(TUNING, "systemctl")

swap_sources = role_module("swap", "swap_sources")


def test_gpt_auto_swap_unit_is_found():
    # issue 17 input 2: the Jinja regex of the folded YAML block found nothing in this line
    assert parse_systemctl_units(read(SYSTEMCTL, "gpt-auto.list-units")) == [
        {"unit": "dev-sda3.swap", "load": "loaded", "active": "active", "sub": "active",
         "description": "Swap Partition"}]


def test_padded_listing_with_zram_and_an_inactive_unit():
    units = parse_systemctl_units(read(SYSTEMCTL, "debian12-zram.list-units"))
    assert [u["unit"] for u in units] == [
        "dev-disk-by\\x2did-ata\\x2dQEMU_HARDDISK_QM00001\\x2dpart3.swap",
        "dev-disk-by\\x2dpartuuid-5b2d7f1e\\x2d03.swap",
        "dev-disk-by\\x2duuid-0b1c2d3e\\x2d4f50\\x2d6172\\x2d8394\\x2da5b6c7d8e9f0.swap",
        "dev-disk-by\\x2duuid-7d0f4b7e\\x2d2a71\\x2d4c4b\\x2d9b0e\\x2d3f1c6e2a9d40.swap",
        "dev-sda3.swap",
        "dev-zram0.swap",
    ]
    assert units[3]["active"] == "inactive" and units[3]["sub"] == "dead"
    assert units[5] == {"unit": "dev-zram0.swap", "load": "loaded", "active": "active", "sub": "active",
                        "description": "Compressed Swap on /dev/zram0"}


def test_failed_unit_bullet_and_blank_lines():
    text = "\n\u25cf swapfile.swap loaded failed failed /swapfile\nvar-swap.swap masked inactive dead\n"
    assert parse_systemctl_units(text) == [
        {"unit": "swapfile.swap", "load": "loaded", "active": "failed", "sub": "failed", "description": "/swapfile"},
        {"unit": "var-swap.swap", "load": "masked", "active": "inactive", "sub": "dead", "description": ""}]


def test_only_services_enabled_or_active_are_returned():
    show = ("Id=dphys-swapfile.service\nLoadState=loaded\nActiveState=inactive\nSubState=dead\n"
            "UnitFileState=disabled\n\n"
            "Id=zramswap.service\nLoadState=loaded\nActiveState=inactive\nSubState=dead\nUnitFileState=enabled\n\n"
            "Id=zram-config.service\nLoadState=masked\nActiveState=inactive\nSubState=dead\nUnitFileState=masked\n")
    assert swap_sources.service_facts(parse_systemctl_show(show)) == [
        {"name": "zramswap.service", "active": "inactive", "sub": "dead", "unit_file_state": "enabled",
         "original": "stopped enabled", "disable": True}]


def test_systemctl_show_blocks():
    blocks = parse_systemctl_show(read(SYSTEMCTL, "debian12-zram.show"))
    assert [b["Id"] for b in blocks] == ["zramswap.service", "zram-config.service", "dphys-swapfile.service",
                                         "systemd-zram-setup@zram0.service"]
    assert blocks[0]["UnitFileState"] == ""
    assert blocks[3] == {"Id": "systemd-zram-setup@zram0.service", "LoadState": "loaded", "ActiveState": "active",
                         "SubState": "exited", "UnitFileState": "static"}


def test_dphys_swapfile_config_as_sh_sources_it():
    assert parse_shell_assignments(read(TUNING, "raspios-dphys", "etc", "dphys-swapfile")) == {"CONF_SWAPSIZE": "100"}
    text = 'CONF_SWAPSIZE=100\nCONF_SWAPFILE="/srv/swap file"  # moved\nCONF_SWAPSIZE=2048\n. /etc/other\n'
    assert parse_shell_assignments(text) == {"CONF_SWAPSIZE": "2048", "CONF_SWAPFILE": "/srv/swap file"}
    with pytest.raises(ValueError):
        parse_shell_assignments('CONF_SWAPFILE="/var/swap\n')


def test_zram_generator_devices():
    assert zram_config_settings([read(TUNING, "debian12-zram", "etc", "systemd", "zram-generator.conf")]) == {"zram0": {}}
    text = "[zram0]\nzram-size = min(ram, 8192)\n\n[ zram1 ]\n# [zram2]\n[zram-x]\nkey = ignored\n[global]\n[zram0]\n"
    # A later file's value wins, key by key.
    assert zram_config_settings([text, "; vendor override\n[zram1]\nmount-point=/tmp\n[zram0]\nzram-size = 0\n"]) == {
        "zram0": {"zram-size": "0"}, "zram1": {"mount-point": "/tmp"}}
    assert [zram_is_swap(kv) for kv in ({}, {"fs-type": "swap"}, {"mount-point": "/tmp"}, {"fs-type": "ext4"})] == [
        True, True, False, False]


@pytest.fixture(name="run_sources")
def fixture_run_sources(tmp_path, monkeypatch, capsys):
    """Run swap_sources on a copy of a fixture tree, with a systemctl that prints the host's fixture output."""
    def run(tree, args=None, systemctl_rc=0, prepare=None):
        root = tmp_path / tree
        shutil.copytree(os.path.join(TUNING, tree), root, dirs_exist_ok=True)  # a test may add files first
        if prepare:
            prepare(root)
        bindir = tmp_path / "bin"
        bindir.mkdir(exist_ok=True)
        fake = bindir / "systemctl"
        # `show` of the swap units (What=, FragmentPath=...) prints TREE.show-units, of the services TREE.show.
        fake.write_text('#!/bin/sh\necho "$@" >> "%s"\n[ %d = 0 ] || { echo "System has not been booted with '
                        'systemd" >&2; exit 1; }\ncase "$1 $2" in\n  list-units*) cat "%s" ;;\n'
                        '  *What*) cat "%s" ;;\n  show*) cat "%s" ;;\nesac\n'
                        % (tmp_path / "systemctl.log", systemctl_rc, os.path.join(SYSTEMCTL, tree + ".list-units"),
                           os.path.join(SYSTEMCTL, tree + ".show-units"), os.path.join(SYSTEMCTL, tree + ".show")))
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ["PATH"]))
        with patch_module_args(dict(args or {}, sysroot=str(root))):
            with pytest.raises(SystemExit):
                swap_sources.main()
        result = json.loads(capsys.readouterr().out)
        calls = (tmp_path / "systemctl.log").read_text().splitlines()
        return root, result, calls
    return run


def test_raspios_dphys_swapfile(run_sources, tmp_path):
    # dphys-swapfile's 100 MiB /var/swap, sparse: only its size matters
    (tmp_path / "raspios-dphys" / "var").mkdir(parents=True)
    with open(tmp_path / "raspios-dphys" / "var" / "swap", "wb") as handle:
        handle.truncate(100 * 1048576)
    _root, result, calls = run_sources("raspios-dphys")
    assert result["changed"] is False and result["systemd"] is True
    assert calls[0] == "list-units --type=swap --all --plain --no-legend --no-pager"
    assert calls[1] == ("show --property=Id,LoadState,ActiveState,SubState,UnitFileState --no-pager "
                        "zramswap.service zram-config.service dphys-swapfile.service")
    assert [u["unit"] for u in result["units"]] == ["var-swap.swap"]
    assert result["services"] == [{"name": "dphys-swapfile.service", "active": "active", "sub": "exited",
                                   "unit_file_state": "enabled", "original": "running enabled", "disable": True}]
    assert result["dphys_swapfile"] == {"config": "/etc/dphys-swapfile", "swapsize": "100", "swapfile": "/var/swap",
                                        "swapfile_bytes": 104857600}
    assert result["zram_generator"] == {"installed": False, "config_files": [], "devices": [], "mount_devices": []}


def test_debian12_zram_generator(run_sources, tmp_path):
    # udev's link of the fstab swap's UUID (the test adds it: a fixture tree holds no device nodes)
    links = tmp_path / "debian12-zram" / "dev" / "disk" / "by-uuid"
    links.mkdir(parents=True)
    (links.parent.parent / "sda3").write_text("")
    (links / "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0").symlink_to("../../sda3")
    _root, result, calls = run_sources("debian12-zram")
    # the active zram device's setup service is asked for too
    assert calls[1].endswith("dphys-swapfile.service systemd-zram-setup@zram0.service")
    assert len(result["units"]) == 6
    assert result["services"] == [{"name": "systemd-zram-setup@zram0.service", "active": "active", "sub": "exited",
                                   "unit_file_state": "static", "original": "running static", "disable": False}]
    assert result["dphys_swapfile"] is None
    assert result["zram_generator"] == {"installed": True, "config_files": ["/etc/systemd/zram-generator.conf"],
                                        "devices": ["zram0"], "mount_devices": []}
    # /dev/sda3 is the fstab swap by UUID (the generated unit's What= resolves to it), zram0 zram-generator's.
    assert calls[2].startswith("show --property=Id,What,FragmentPath,SourcePath,LoadState --no-pager dev-disk-by")
    assert result["origins"] == [
        {"filename": "/dev/sda3",
         "origin": "dev-disk-by\\x2duuid-0b1c2d3e\\x2d4f50\\x2d6172\\x2d8394\\x2da5b6c7d8e9f0.swap"},
        {"filename": "/dev/zram0", "origin": "dev-zram0.swap"}]
    assert (result["unknown_origin"], result["origins_checked"]) == ([], True)


def test_armbian_zram_swap_is_named_with_its_script(run_sources):
    # Issue 39, input 1: an Orange Pi's Armbian, /dev/zram1 made by armbian-zram-config.service (mkswap, swapon -p 5);
    # systemd's dev-zram1.swap only mirrors the active area (no unit file, no source).
    _root, result, calls = run_sources("armbian-zram")
    assert [u["unit"] for u in result["units"]] == ["dev-zram1.swap"] and result["services"] == []
    assert result["zram_scripts"] == [{
        "name": "armbian-zram-config", "service": "armbian-zram-config.service",
        "config": "/etc/default/armbian-zram-config", "script": "/usr/lib/armbian/armbian-zram-config",
        "config_exists": True, "enabled": "true", "swap": None, "reads_swap": True}]
    assert result["origins"] == [{"filename": "/dev/zram1", "origin": "armbian-zram-config.service"}]
    assert result["unknown_origin"] == []


def test_a_swap_area_of_unknown_origin_is_named(run_sources):
    # The same host had Armbian's script been unknown (its files gone here): nothing found makes /dev/zram1, and
    # masking dev-zram1.swap does not stop whatever runs swapon at boot. The areas given are those swap_off saw.
    def forget(root):
        shutil.rmtree(root / "usr")
        (root / "etc" / "default" / "armbian-zram-config").unlink()

    _root, result, _calls = run_sources("armbian-zram", {"areas": ["/dev/zram1"]}, prepare=forget)
    assert result["zram_scripts"] == []
    assert result["origins"] == [{"filename": "/dev/zram1", "origin": None}]
    assert (result["unknown_origin"], result["origins_checked"]) == (["/dev/zram1"], True)


def test_a_script_that_does_not_read_swap_is_reported(run_sources):
    # An older script: ENABLED is all it reads, so the role sets ENABLED=false there.
    def older(root):
        script = root / "usr" / "lib" / "armbian" / "armbian-zram-config"
        script.write_text("\n".join(line for line in script.read_text().splitlines() if "SWAP" not in line))

    _root, result, _calls = run_sources("armbian-zram", prepare=older)
    assert result["zram_scripts"][0]["reads_swap"] is False
    assert result["unknown_origin"] == []


def test_origins_are_not_checked_in_a_container(run_sources):
    # No CAP_SYS_ADMIN: the swap areas /proc/swaps shows are the host's.
    def container(root):
        (root / "proc" / "self").mkdir()
        (root / "proc" / "self" / "status").write_text("Name:\tpython3\nCapEff:\t00000000a80425fb\n")

    _root, result, _calls = run_sources("armbian-zram", prepare=container)
    assert (result["origins_checked"], result["unknown_origin"]) == (False, [])
    assert result["origins_note"] == "not checked: no CAP_SYS_ADMIN (a container), the swap areas are the host's"


def test_zram_generator_drop_ins_are_read(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(os.path.join(TUNING, "debian12-zram"), root)
    dropins = root / "usr" / "lib" / "systemd" / "zram-generator.conf.d"
    dropins.mkdir(parents=True)
    (dropins / "50-writeback.conf").write_text("[zram1]\nzram-size = ram / 4\n")
    (dropins / "README").write_text("[zram7]\n")  # not *.conf: zram-generator skips it
    (dropins / "60-tmp.conf").write_text("[zram2]\nmount-point = /tmp\n")
    # The same name in /etc hides the vendor's file.
    (root / "etc" / "systemd" / "zram-generator.conf.d").mkdir()
    (root / "etc" / "systemd" / "zram-generator.conf.d" / "60-tmp.conf").write_text("[zram3]\n")
    assert swap_sources.zram_generator_facts(str(root)) == {
        "installed": True,
        "config_files": ["/etc/systemd/zram-generator.conf",
                         "/usr/lib/systemd/zram-generator.conf.d/50-writeback.conf",
                         "/etc/systemd/zram-generator.conf.d/60-tmp.conf"],
        "devices": ["zram0", "zram1", "zram3"], "mount_devices": []}


def test_without_systemd(run_sources):
    _root, result, calls = run_sources("debian12-zram", systemctl_rc=1)
    assert calls == ["list-units --type=swap --all --plain --no-legend --no-pager"]
    assert result["systemd"] is False and result["units"] == [] and result["services"] == []
    assert (result["origins_checked"], result["unknown_origin"]) == (False, [])
    assert result["zram_generator"]["installed"] is True


def test_dphys_config_sh_cannot_source(tmp_path, capsys):
    bad = tmp_path / "etc" / "dphys-swapfile"
    bad.parent.mkdir()
    bad.write_text('CONF_SWAPFILE="/var/swap\n')
    with patch_module_args({"sysroot": str(tmp_path)}):
        with pytest.raises(SystemExit):
            swap_sources.main()
    result = json.loads(capsys.readouterr().out)
    assert result["failed"] is True
    assert result["msg"] == "/etc/dphys-swapfile: No closing quotation (sh could not source it either)"
