"""The swap role's zram-generator drop-in, judged by the real zram-generator in its test mode (ZRAM_GENERATOR_ROOT).

Debian's systemd-zram-generator (1.1.2 in Debian 12) runs here, installed or unpacked into the cache by
scripts/setup-controller.sh; roles/swap/library/zram_generator_units.py runs it on a copy of a host's configuration.
The drop-in is rendered from the role's template as Ansible renders it, for the devices boot.yml computes from
swap_sources' facts on the same host.
"""

import json
import os

import pytest
from conftest import FIXTURES, read, role_module, zram_generator
from test_jinja_expressions import render, render_template_file, task

from ansible.module_utils.testing import patch_module_args

GENERATOR = zram_generator()
pytestmark = pytest.mark.skipif(GENERATOR is None, reason="zram-generator is not installed (Debian package "
                                "systemd-zram-generator; scripts/setup-controller.sh unpacks it into the cache)")

units = role_module("swap", "zram_generator_units")
swap_sources = role_module("swap", "swap_sources")
DROPIN = "/etc/systemd/zram-generator.conf.d/zz-llmtune.conf"
MEMINFO = read(FIXTURES, "tuning", "debian12-zram", "proc", "meminfo")


def host(tmp_path, files, cmdline="BOOT_IMAGE=/vmlinuz-6.1.0-27-amd64 root=/dev/sda1 ro quiet"):
    """A sysroot holding FILES ({path: text}) and the /proc files the generator reads; its path."""
    root = tmp_path / "host"
    for path, text in dict(files, **{"/proc/meminfo": MEMINFO, "/proc/cmdline": cmdline + "\n"}).items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return str(root)


def role_dropin(root):
    """The drop-in the swap role writes on the host ROOT: boot.yml's devices from swap_sources, its template."""
    block = task("roles/swap/tasks/boot.yml", "Keep zram-generator from making zram swap")
    facts = {"zram_generator": swap_sources.zram_generator_facts(root)}
    devices = render(block["vars"]["swap_zram_devices"], swap_sources_result=facts)
    return render_template_file("roles/swap/templates/zram-generator.conf.j2", swap_zram_devices=devices,
                                ansible_managed="Ansible managed")


def generated(root, content=None):
    """(swap units, mount units) the real generator makes on ROOT, with the drop-in CONTENT when given."""
    result = units.run(root, GENERATOR, DROPIN if content is not None else None, content)
    return result["swap_units"], result["mount_units"]


def test_older_keys_are_zeroed_too(tmp_path):
    # Issue 39, input 2: a Fedora 33-era configuration (zram-generator 0.3.x, as Ubuntu 22.04 ships, knows no
    # zram-size). zram-fraction and max-zram-size override zram-size (zram-generator.conf(5)).
    root = host(tmp_path, {"/etc/systemd/zram-generator.conf": "[zram0]\nzram-fraction = 0.5\nmax-zram-size = 4096\n"})
    assert generated(root) == (["dev-zram0.swap"], [])
    # The drop-in as it was, zram-size = 0 alone: the generator still makes the swap.
    assert generated(root, "[zram0]\nzram-size = 0\n") == (["dev-zram0.swap"], [])
    dropin = role_dropin(root)
    assert "zram-fraction = 0" in dropin and "max-zram-size = 0" in dropin
    assert generated(root, dropin) == ([], [])


def test_debians_own_configuration_and_the_kernel_option(tmp_path):
    root = host(tmp_path, {"/etc/systemd/zram-generator.conf":
                           read(FIXTURES, "tuning", "debian12-zram", "etc", "systemd", "zram-generator.conf")})
    assert generated(root) == (["dev-zram0.swap"], [])
    assert generated(root, role_dropin(root)) == ([], [])
    # systemd.zram=1 makes zram0 without any file; the drop-in names zram0 for it.
    bare = host(tmp_path / "bare", {}, cmdline="BOOT_IMAGE=/vmlinuz root=/dev/sda1 systemd.zram=1")
    assert generated(bare) == (["dev-zram0.swap"], [])
    assert generated(bare, role_dropin(bare)) == ([], [])


def test_a_zram_file_system_keeps_its_size(tmp_path):
    # A compressed /var/log on zram1 (Armbian's ramlog done with zram-generator) is not swap: left alone.
    root = host(tmp_path, {
        "/usr/lib/systemd/zram-generator.conf.d/10-swap.conf": "[zram0]\nzram-size = ram / 2\n",
        "/etc/systemd/zram-generator.conf.d/50-ramlog.conf":
            "[zram1]\nzram-size = 64\nfs-type = ext4\nmount-point = /var/log\n"})
    facts = swap_sources.zram_generator_facts(root)
    assert (facts["devices"], facts["mount_devices"]) == (["zram0"], ["zram1"])
    assert generated(root) == (["dev-zram0.swap"], ["var-log.mount"])
    dropin = role_dropin(root)
    assert "[zram1]" not in dropin
    assert generated(root, dropin) == ([], ["var-log.mount"])


def test_a_masked_file_stays_masked_in_the_copy(tmp_path):
    # /etc/systemd/zram-generator.conf -> /dev/null hides the vendor's file (zram-generator.conf(5)).
    root = host(tmp_path, {"/usr/lib/systemd/zram-generator.conf": "[zram0]\n"})
    assert generated(root) == (["dev-zram0.swap"], [])
    os.makedirs(os.path.join(root, "etc", "systemd"))
    os.symlink("/dev/null", os.path.join(root, "etc", "systemd", "zram-generator.conf"))
    assert generated(root) == ([], [])


def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            units.main()
    return json.loads(capsys.readouterr().out)


def test_module_answers_in_check_mode_and_fails_with_the_generators_message(tmp_path, capsys):
    root = host(tmp_path, {"/etc/systemd/zram-generator.conf": "[zram0]\nzram-fraction = 0.5\n"})
    result = run_module({"sysroot": root, "generator": GENERATOR, "dropin_path": DROPIN,
                         "dropin_content": role_dropin(root), "_ansible_check_mode": True}, capsys)
    assert (result["changed"], result["installed"], result["swap_units"]) == (False, True, [])
    assert result["config_files"] == ["/etc/systemd/zram-generator.conf", DROPIN]
    # The drop-in was checked in a copy: nothing written on the host.
    assert not os.path.exists(os.path.join(root, DROPIN.lstrip("/")))
    # A configuration the generator cannot parse fails with its own words.
    bad = host(tmp_path / "bad", {"/etc/systemd/zram-generator.conf": "[zram0]\nswap-priority = lots\n"})
    result = run_module({"sysroot": bad, "generator": GENERATOR}, capsys)
    assert result["failed"] is True
    assert result["msg"].startswith(GENERATOR + " (test mode) failed with status 1: ")
    assert "swap-priority" in result["msg"] or "lots" in result["msg"]
    # No generator installed under the sysroot: nothing to ask.
    assert run_module({"sysroot": bad}, capsys)["installed"] is False
