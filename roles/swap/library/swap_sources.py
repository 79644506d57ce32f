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
  - Reads the Armbian and Orange Pi zram-config boot scripts (C(/usr/lib/armbian/armbian-zram-config),
    C(/usr/lib/orangepi/orangepi-zram-config)) and their C(/etc/default) files, which run C(mkswap) and C(swapon)
    on zram themselves in the service that also makes their compressed C(/var/log); RV(zram_scripts) says whether
    the installed script reads C(SWAP).
  - Names the origin of each swap area of O(areas) (RV(origins)) among what it found, each of which the swap role
    turns off, and lists those of none (RV(unknown_origin)). Masking the swap unit systemd makes for an active
    area does not keep whatever runs C(swapon) from making it again at boot.
  - Without systemd (no C(systemctl), or systemctl cannot reach it) C(units) and C(services) are empty,
    C(systemd) is false and no origin is checked; nor is one without C(CAP_SYS_ADMIN) (a container, whose swap
    areas are the host's).
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
  areas:
    description: Swap areas (C(/proc/swaps) file names) whose origin to name, e.g. those active before the role
      turned swap off; default those active now.
    type: list
    elements: str
  fstab:
    description: fstab whose swap lines count as an origin, active or commented out by the role (C(#llmtune# )).
    type: str
    default: /etc/fstab
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
zram_scripts:
  description: Armbian / Orange Pi zram-config scripts present (their script or configuration file), with the
    C(ENABLED) and C(SWAP) their configuration sets (null when unset) and whether the script reads C(SWAP).
  returned: always
  type: list
  elements: dict
  sample: [{"name": "armbian-zram-config", "service": "armbian-zram-config.service",
            "config": "/etc/default/armbian-zram-config", "script": "/usr/lib/armbian/armbian-zram-config",
            "config_exists": true, "enabled": "true", "swap": null, "reads_swap": true}]
origins:
  description: Each area of O(areas) with what sets it up at boot, null when nothing found does; C(fstab),
    C(dphys-swapfile), C(zram-generator), a swap unit backed by a unit file or fstab, or a service.
  returned: always
  type: list
  elements: dict
  sample: [{"filename": "/dev/zram1", "origin": "armbian-zram-config.service"}]
unknown_origin:
  description: Areas of O(areas) whose origin none of these is; they come back at the next boot.
  returned: always
  type: list
  elements: str
origins_checked:
  description: Whether origins were checked (systemd answered, and C(CAP_SYS_ADMIN) is not known to be missing).
  returned: always
  type: bool
origins_note:
  description: Why origins were not checked; empty when they were.
  returned: always
  type: str
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
from ansible.module_utils.llmtune_swap import (DPHYS_DEFAULT_SWAPFILE, ZRAM_CONFIG_DIRS, ZRAM_SCRIPTS, ZRAM_SERVICES,
                                               fstab_device, fstab_swap_specs, parse_shell_assignments,
                                               parse_systemctl_show, parse_systemctl_units, script_reads_swap,
                                               zram_config_settings, zram_is_swap)
from ansible.module_utils.llmtune_sysfs import has_capability, parse_proc_swaps, read_text, sysroot_path

CAP_SYS_ADMIN = 21  # include/uapi/linux/capability.h; swapon(2)/swapoff(2) need it

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


def zram_script_facts(sysroot):
    """Return the Armbian / Orange Pi zram-config scripts present (config or script file), see RETURN."""
    found = []
    for entry in ZRAM_SCRIPTS:
        config = read_text(sysroot, entry["config"])
        script = read_text(sysroot, entry["script"])
        if config is None and script is None:
            continue
        values = parse_shell_assignments(config or "")
        found.append(dict(entry, config_exists=config is not None, enabled=values.get("ENABLED"),
                          swap=values.get("SWAP"), reads_swap=script is not None and script_reads_swap(script)))
    return found


def same_file(sysroot, first, second):
    """True when paths ``first`` and ``second`` (under ``sysroot``) name the same file or device node."""
    if first == second:
        return True
    return os.path.realpath(sysroot_path(sysroot, first)) == os.path.realpath(sysroot_path(sysroot, second))


def swap_origin(sysroot, area, found):
    """Return what sets swap area ``area`` (its /proc/swaps file name) up at boot, or None when nothing found does.

    ``found`` holds what this module found: ``fstab`` (swap sources of fstab, active or commented out by the role),
    ``dphys`` (dphys-swapfile facts or None), ``zram_generator``, ``services``, ``zram_scripts``, ``unit_files``
    (``{unit: What=}`` of swap units backed by a unit file or fstab). Each of these the role turns off; a swap
    unit systemd made only because the area is active (no file, no source) is no origin.
    """
    for spec in found["fstab"]:
        if same_file(sysroot, fstab_device(spec), area):
            return "fstab"
    dphys = found["dphys"]
    if dphys and same_file(sysroot, dphys["swapfile"], area):
        return "dphys-swapfile"
    for unit, what in sorted(found["unit_files"].items()):
        if what and same_file(sysroot, what, area):
            return unit
    services = [service["name"] for service in found["services"]]
    if area.startswith("/dev/zram"):
        device = os.path.basename(area)
        generator = found["zram_generator"]
        if generator["installed"] and (device in generator["devices"] or device == "zram0"):
            return "zram-generator"
        zram = [name for name in services if name in ZRAM_SERVICES or name.startswith("systemd-zram-setup@")]
        zram += [entry["service"] for entry in found["zram_scripts"]]
        if zram:
            return zram[0]
    # A service the operator listed, not one whose swap this module knows: it may set up any area.
    others = [name for name in services if name not in ZRAM_SERVICES and name != "dphys-swapfile.service"
              and not name.startswith("systemd-zram-setup@")]
    return others[0] if others else None


def main():
    module = AnsibleModule(
        argument_spec={
            "services": {"type": "list", "elements": "str",
                         "default": ["zramswap.service", "zram-config.service", "dphys-swapfile.service"]},
            "dphys_config": {"type": "path", "default": "/etc/dphys-swapfile"},
            "areas": {"type": "list", "elements": "str"},
            "fstab": {"type": "str", "default": "/etc/fstab"},
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
    try:
        scripts = zram_script_facts(sysroot)
    except ValueError as err:
        module.fail_json(msg="a zram-config file: %s (sh could not source it either)" % err)
    areas = params["areas"]
    if areas is None:
        areas = [a["filename"] for a in parse_proc_swaps(read_text(sysroot, "/proc/swaps", ""))]
    result = {"changed": False, "systemd": False, "units": [], "services": [], "dphys_swapfile": dphys,
              "zram_generator": zram, "zram_scripts": scripts, "origins": [], "unknown_origin": [],
              "origins_checked": False, "origins_note": ""}

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

    # Whose swap each area is. Without systemd the units and services cannot be asked; without CAP_SYS_ADMIN (a
    # container) the areas are the host's, not ours to keep off.
    if not result["systemd"]:
        result["origins_note"] = "not checked: systemctl cannot reach systemd, whose units and services set swap up"
    elif has_capability(read_text(sysroot, "/proc/self/status", ""), CAP_SYS_ADMIN) is False:
        result["origins_note"] = "not checked: no CAP_SYS_ADMIN (a container), the swap areas are the host's"
    elif areas:
        unit_files = {}
        if result["units"]:
            rc, out, err = module.run_command(
                [systemctl, "show", "--property=Id,What,FragmentPath,SourcePath,LoadState", "--no-pager"]
                + [u["unit"] for u in result["units"]], environ_update=env)
            if rc != 0:
                module.fail_json(msg="systemctl show of the swap units failed: %s" % err.strip(), **result)
            unit_files = {b.get("Id", ""): b.get("What", "") for b in parse_systemctl_show(out)
                          if b.get("LoadState") != "masked"
                          and (b.get("FragmentPath", "") not in ("", "/dev/null") or b.get("SourcePath"))}
        fstab = read_text(sysroot, params["fstab"], "") if params["fstab"] else ""
        found = {"fstab": fstab_swap_specs(fstab), "dphys": dphys, "zram_generator": zram,
                 "services": result["services"], "zram_scripts": scripts, "unit_files": unit_files}
        result["origins"] = [{"filename": area, "origin": swap_origin(sysroot, area, found)} for area in areas]
        result["unknown_origin"] = [o["filename"] for o in result["origins"] if o["origin"] is None]
        result["origins_checked"] = True
    module.exit_json(**result)


if __name__ == "__main__":
    main()
