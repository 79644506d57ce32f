# -*- coding: utf-8 -*-
"""Parsers for what sets swap up at boot: systemctl listings, dphys-swapfile and zram-generator configs.

Used by the swap role's modules (roles/swap/library), so that no command output or config file is parsed
with a regex inside YAML/Jinja, where the escaping of backslashes depends on the YAML scalar style.
"""

from __future__ import annotations

import re
import shlex

from ansible.module_utils.llmtune_sysfs import FSTAB_SWAP_MARK, is_fstab_swap_line

# systemctl marks failed units with a bullet even in --plain output on some versions (systemd < 243 used "*").
_BULLETS = ("\u25cf", "*")

# dphys-swapfile(8): CONF_SWAPFILE defaults to /var/swap when the config does not set it.
DPHYS_DEFAULT_SWAPFILE = "/var/swap"


def parse_systemctl_units(text):
    """Parse ``systemctl list-units --plain --no-legend [--all]`` output into a list of dicts.

    Each line is ``UNIT LOAD ACTIVE SUB DESCRIPTION`` separated by runs of spaces (systemctl pads the
    columns), e.g. ``dev-sda3.swap loaded active active Swap Partition``. Keys: ``unit``, ``load``
    (loaded, not-found, masked, ...), ``active`` (active, inactive, failed, ...), ``sub`` (unit-type
    state, e.g. ``active``/``dead`` for swap units, ``exited`` for oneshot services) and ``description``
    (str, may be empty). Unit names keep systemd's escaping (``dev-disk-by\\x2duuid-....swap``).
    A leading failed-unit bullet is dropped; blank and short lines are skipped. Source: systemctl(1).
    """
    units = []
    for line in (text or "").splitlines():
        fields = line.split(None, 4)
        if fields and fields[0] in _BULLETS:
            fields = line.split(None, 5)[1:]
        if len(fields) < 4:
            continue
        units.append({"unit": fields[0], "load": fields[1], "active": fields[2], "sub": fields[3],
                      "description": fields[4].strip() if len(fields) > 4 else ""})
    return units


def parse_systemctl_show(text):
    """Parse ``systemctl show -p NAME,... UNIT...`` output into a list of ``{property: value}`` dicts.

    systemctl prints one ``Name=value`` line per property and an empty line between units, in the order
    the units were given (systemctl(1), "show"). Values are kept as str; an empty value stays ``""``.
    """
    blocks = []
    current = {}
    for line in (text or "").splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
            current = {}
            continue
        name, sep, value = line.partition("=")
        if sep:
            current[name] = value
    if current:
        blocks.append(current)
    return blocks


def parse_shell_assignments(text):
    """Return the variables a ``sh`` fragment of plain assignments sets, as ``{name: value}`` (str).

    For config files that are sourced, such as /etc/dphys-swapfile ("a sh script fragment full of
    assignments", dphys-swapfile(8)). Words are split and unquoted as sh does (``shlex``, comments
    dropped); a later assignment overrides an earlier one, as when the file is sourced. Lines that are
    not a single ``NAME=value`` word (commands, ``export``) are ignored; a line sh could not parse
    (unbalanced quote) raises ``ValueError``.
    """
    values = {}
    for line in (text or "").splitlines():
        words = shlex.split(line, comments=True)
        if len(words) != 1:
            continue
        name, sep, value = words[0].partition("=")
        if sep and name.isidentifier():
            values[name] = value
    return values


# zram-generator.conf(5), "CONFIGURATION DIRECTORIES AND PRECEDENCE": /etc over /run over /usr/local/lib over /usr/lib.
ZRAM_CONFIG_DIRS = ("/etc/systemd", "/run/systemd", "/usr/local/lib/systemd", "/usr/lib/systemd")
# Keys of the device size in any zram-generator release: zram-size (0.3 and later), zram-fraction and max-zram-size
# (every release; when set they override zram-size, zram-generator.conf(5) "OBSOLETE OPTIONS").
ZRAM_SIZE_KEYS = ("zram-size", "zram-fraction", "max-zram-size")


def zram_config_settings(texts):
    """Merge zram-generator config texts, lowest precedence first, into ``{device: {key: value}}``.

    Sections ``[zramN]`` only (zram-generator.conf(5)); ``key = value`` lines, comments starting with ``#`` or ``;``
    (systemd.syntax(7)); a later file's value for a key replaces an earlier one.
    """
    devices = {}
    for text in texts:
        section = None
        for line in (text or "").splitlines():
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                name = line[1:-1].strip()
                section = name if name.startswith("zram") and name[4:].isdigit() else None
                if section:
                    devices.setdefault(section, {})
                continue
            key, sep, value = line.partition("=")
            if section and sep:
                devices[section][key.strip()] = value.strip()
    return devices


def zram_is_swap(settings):
    """True when a device's merged settings make it swap: neither ``mount-point`` nor an ``fs-type`` but ``swap``.

    zram-generator.conf(5): "When neither this option nor fs-type= is specified, the device will be formatted as
    swap"; a device with a mount point is a file system (a compressed /tmp or /var/log), not swap.
    """
    return not settings.get("mount-point") and settings.get("fs-type", "swap") in ("", "swap")


# Boot scripts of Armbian and Orange Pi's images that make zram swap themselves (mkswap, swapon), in the same
# service as their compressed /var/log (ramlog) and /tmp: ENABLED=false stops all three, SWAP=false only the swap,
# where the installed script reads SWAP (older ones do not).
ZRAM_SCRIPTS = (
    {"name": "armbian-zram-config", "service": "armbian-zram-config.service",
     "config": "/etc/default/armbian-zram-config", "script": "/usr/lib/armbian/armbian-zram-config"},
    {"name": "orangepi-zram-config", "service": "orangepi-zram-config.service",
     "config": "/etc/default/orangepi-zram-config", "script": "/usr/lib/orangepi/orangepi-zram-config"},
)
# Services in swap_sources' default list whose swap is zram (zram-tools, Ubuntu's zram-config).
ZRAM_SERVICES = ("zramswap.service", "zram-config.service")
# fstab tags and the /dev/disk folders udev links them in (man 5 fstab, udev's 60-persistent-storage.rules).
FSTAB_TAGS = {"UUID": "by-uuid", "LABEL": "by-label", "PARTUUID": "by-partuuid", "PARTLABEL": "by-partlabel"}


def script_reads_swap(text):
    """True when a zram-config script reads ``SWAP`` (``$SWAP``, ``${SWAP}``; ``$SWAP_ALGORITHM`` does not count)."""
    return bool(re.search(r"\$\{?SWAP\b(?!_)", text or ""))


def fstab_swap_specs(text):
    """Return the first field of every swap line of an fstab text, active or commented out by llmtune."""
    specs = []
    for line in (text or "").splitlines():
        if line.startswith(FSTAB_SWAP_MARK):
            line = line[len(FSTAB_SWAP_MARK):]
        if is_fstab_swap_line(line):
            specs.append(line.split()[0])
    return specs


def fstab_device(spec):
    """The path an fstab source names: ``UUID=x`` is ``/dev/disk/by-uuid/x`` (and so on), a path itself."""
    tag, sep, value = spec.partition("=")
    if sep and tag in FSTAB_TAGS:
        return "/dev/disk/%s/%s" % (FSTAB_TAGS[tag], value.strip('"'))
    return spec
