#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: list what sets swap up again at boot (swap units, swap services, dphys-swapfile, zram-generator)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: swap_sources
short_description: List what sets swap up again at boot
description:
  - Read only; the swap role masks, disables and rewrites from what this module returns.
  - Lists the systemd swap units with C(systemctl list-units --type=swap --all --plain --no-legend)
    (systemctl(1)), the ones systemd-fstab-generator makes from fstab, systemd-gpt-auto-generator's
    C(Swap Partition), the zram devices of zram-generator, and unit files.
  - Reads the state of the services that create swap at boot (O(services)), and with zram-generator
    installed of C(systemd-zram-setup@zramN.service) for every device its configuration names or that is an
    active swap area (C(systemctl show), systemctl(1)). Services that are not installed, or neither enabled
    nor active, are left out.
  - Reads C(CONF_SWAPSIZE) and C(CONF_SWAPFILE) (default C(/var/swap)) from the dphys-swapfile configuration
    O(dphys_config), a sourced sh fragment (dphys-swapfile(8)), and the size of that swap file.
  - Reads every zram-generator configuration file, C(zram-generator.conf) and C(zram-generator.conf.d/*.conf)
    under C(/etc/systemd), C(/run/systemd), C(/usr/local/lib/systemd) and C(/usr/lib/systemd)
    (zram-generator.conf(5)), and returns the C([zramN]) devices they name, swap devices apart from those
    formatted as file systems.
  - Without systemd (no C(systemctl), or systemctl cannot reach it) C(units) and C(services) are empty and
    C(systemd) is false.
  - Supports check mode (it changes nothing in either mode).
options:
  services:
    description: Services that create swap at boot, e.g. zram-tools' C(zramswap.service), Ubuntu's
      C(zram-config.service), C(dphys-swapfile.service) (Raspberry Pi OS).
    type: list
    elements: str
    default: [zramswap.service, zram-config.service, dphys-swapfile.service]
  dphys_config:
    description: dphys-swapfile configuration file.
    type: path
    default: /etc/dphys-swapfile
  sysroot:
    description: Directory C(/proc) and the configuration files are resolved under (C(/) on a live system).
      C(systemctl) always asks the running systemd.
    type: path
    default: /
author: llmtune contributors
"""

EXAMPLES = r"""
- name: Find what brings swap back at boot
  swap_sources:
  register: swap_sources_result
"""

RETURN = r"""
systemd:
  description: Whether systemctl answered; false leaves C(units) and C(services) empty.
  returned: always
  type: bool
units:
  description: Swap units, as listed by systemctl (names keep systemd's escaping).
  returned: always
  type: list
  elements: dict
  sample: [{"unit": "dev-sda3.swap", "load": "loaded", "active": "active", "sub": "active",
            "description": "Swap Partition"}]
services:
  description: Installed services that create swap at boot and are enabled or active (nothing to undo in the
    others). C(original) is the value the state file records for a rollback, C(running|stopped) and the
    unit file state (C(running) for an active oneshot service too);
    C(disable) is true when the unit is enabled (static units, such as zram-generator's instances, cannot be).
  returned: always
  type: list
  elements: dict
  sample: [{"name": "dphys-swapfile.service", "active": "active", "sub": "exited", "unit_file_state": "enabled",
            "original": "running enabled", "disable": true}]
dphys_swapfile:
  description: The dphys-swapfile configuration, or null when O(dphys_config) does not exist.
    C(swapsize) is C(CONF_SWAPSIZE) (MiB as a string; null when unset, dphys-swapfile then computes a size),
    C(swapfile) is C(CONF_SWAPFILE), C(swapfile_bytes) its size (null when it does not exist).
  returned: always
  type: dict
  sample: {"config": "/etc/dphys-swapfile", "swapsize": "100", "swapfile": "/var/swap", "swapfile_bytes": 104857600}
zram_generator:
  description: Whether zram-generator is installed, the configuration files found (in the order their values
    apply), the swap devices they name (C(devices)) and the devices they format as file systems instead
    (C(mount_devices), with C(mount-point=) or C(fs-type=), zram-generator.conf(5)), which are not swap.
  returned: always
  type: dict
  sample: {"installed": true, "config_files": ["/etc/systemd/zram-generator.conf"], "devices": ["zram0"],
           "mount_devices": ["zram1"]}
"""

import glob
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_swap import (DPHYS_DEFAULT_SWAPFILE, ZRAM_CONFIG_DIRS, parse_shell_assignments,
                                               parse_systemctl_show, parse_systemctl_units, zram_config_settings,
                                               zram_is_swap)
from ansible.module_utils.llmtune_sysfs import parse_proc_swaps, read_text, sysroot_path

ZRAM_GENERATOR_BINARIES = ("/usr/lib/systemd/system-generators/zram-generator",
                           "/lib/systemd/system-generators/zram-generator")
# Unit file states systemctl disable acts on; static/indirect/generated units have no [Install] to undo.
DISABLABLE = ("enabled", "enabled-runtime", "linked", "linked-runtime", "alias")


def zram_config_files(sysroot):
    """Return zram-generator's config files under ``sysroot``, in the order their values apply (last wins).

    Main files first (``/usr/lib`` before ``/etc``), then the drop-ins sorted by file name whatever their folder, a
    name in a folder of higher precedence hiding the same name below it (zram-generator.conf(5)).
    """
    mains = [d + "/zram-generator.conf" for d in reversed(ZRAM_CONFIG_DIRS)
             if os.path.lexists(sysroot_path(sysroot, d + "/zram-generator.conf"))]
    dropins = {}
    for directory in ZRAM_CONFIG_DIRS:
        for path in glob.glob(sysroot_path(sysroot, directory + "/zram-generator.conf.d/*.conf")):
            dropins.setdefault(os.path.basename(path), directory + "/zram-generator.conf.d/" + os.path.basename(path))
    return mains + [dropins[name] for name in sorted(dropins)]


def zram_generator_facts(sysroot):
    """Return ``{installed, config_files, devices, mount_devices}`` for zram-generator under ``sysroot``.

    ``devices`` are the swap devices the configuration names; ``mount_devices`` those it formats as file systems
    (``mount-point=``, ``fs-type=``: a compressed /tmp or /var/log), which are not swap and are left alone.
    """
    installed = any(os.path.exists(sysroot_path(sysroot, path)) for path in ZRAM_GENERATOR_BINARIES)
    files = [path for path in zram_config_files(sysroot) if read_text(sysroot, path) is not None]
    settings = zram_config_settings(read_text(sysroot, path) for path in files)

    def number(device):
        return int(device[4:])

    return {"installed": installed, "config_files": files,
            "devices": sorted((d for d, kv in settings.items() if zram_is_swap(kv)), key=number),
            "mount_devices": sorted((d for d, kv in settings.items() if not zram_is_swap(kv)), key=number)}


def dphys_swapfile_facts(sysroot, config):
    """Return the dphys-swapfile settings of ``config`` (see RETURN), or None when it does not exist."""
    text = read_text(sysroot, config)
    if text is None:
        return None
    values = parse_shell_assignments(text)
    swapfile = values.get("CONF_SWAPFILE") or DPHYS_DEFAULT_SWAPFILE
    try:
        size = os.stat(sysroot_path(sysroot, swapfile)).st_size
    except OSError:
        size = None
    return {"config": config, "swapsize": values.get("CONF_SWAPSIZE") or None, "swapfile": swapfile,
            "swapfile_bytes": size}


def service_facts(show_blocks):
    """Turn ``systemctl show`` blocks into the ``services`` return value: installed units, enabled or active."""
    services = []
    for block in show_blocks:
        file_state = block.get("UnitFileState", "")
        active = block.get("ActiveState") == "active"
        if block.get("LoadState") != "loaded" or not (file_state in DISABLABLE or active):
            continue
        services.append({
            "name": block.get("Id", ""),
            "active": block.get("ActiveState", ""),
            "sub": block.get("SubState", ""),
            "unit_file_state": file_state,
            # The rollback starts the service again when the first word is "running".
            "original": "%s %s" % ("running" if active else "stopped", file_state),
            "disable": file_state in DISABLABLE,
        })
    return services


def main():
    module = AnsibleModule(
        argument_spec={
            "services": {"type": "list", "elements": "str",
                         "default": ["zramswap.service", "zram-config.service", "dphys-swapfile.service"]},
            "dphys_config": {"type": "path", "default": "/etc/dphys-swapfile"},
            "sysroot": {"type": "path", "default": "/"},
        },
        supports_check_mode=True,
    )
    params = module.params
    sysroot = params["sysroot"]
    try:
        dphys = dphys_swapfile_facts(sysroot, params["dphys_config"])
    except ValueError as err:
        module.fail_json(msg="%s: %s (sh could not source it either)" % (params["dphys_config"], err))
    zram = zram_generator_facts(sysroot)
    result = {"changed": False, "systemd": False, "units": [], "services": [], "dphys_swapfile": dphys,
              "zram_generator": zram}

    systemctl = module.get_bin_path("systemctl")
    if systemctl:
        env = {"LC_ALL": "C", "SYSTEMD_COLORS": "0"}
        rc, out, _err = module.run_command([systemctl, "list-units", "--type=swap", "--all", "--plain",
                                            "--no-legend", "--no-pager"], environ_update=env)
        if rc == 0:
            result["systemd"] = True
            result["units"] = parse_systemctl_units(out)
            names = list(params["services"])
            if zram["installed"]:
                active = [os.path.basename(a["filename"]) for a in
                          parse_proc_swaps(read_text(sysroot, "/proc/swaps", ""))
                          if a["filename"].startswith("/dev/zram")]
                for dev in zram["devices"] + active:
                    if "systemd-zram-setup@%s.service" % dev not in names:
                        names.append("systemd-zram-setup@%s.service" % dev)
            rc, out, err = module.run_command(
                [systemctl, "show", "--property=Id,LoadState,ActiveState,SubState,UnitFileState", "--no-pager"]
                + names, environ_update=env)
            if rc != 0:
                module.fail_json(msg="systemctl show %s failed: %s" % (" ".join(names), err.strip()), **result)
            result["services"] = service_facts(parse_systemctl_show(out))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
