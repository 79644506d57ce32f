#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: compare wanted tuning with the running kernel and render the drift table. Reads only."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tuning_drift
short_description: Compare wanted kernel tuning with the running kernel, and render the drift table
description:
  - Reads, never writes. For each entry of O(settings) reads the sysfs/procfs file with the parser the
    C(kernel_setting) module uses (the bracketed word of a choice file such as THP C(enabled),
    Documentation/admin-guide/mm/transhuge.rst; else the text with white space collapsed) and compares it
    with the wanted value.
  - A row's status is C(ok), C(drift), C(pending reboot) (configured for the next boot, not in force in
    the running kernel), or C(n/a) with a one-line reason - the file is absent (the kernel lacks the
    interface) or differs but cannot be written (read-only C(/sys) in a container, where the role could
    not set it either).
  - With O(boot_params), adds one row per kernel boot parameter. A parameter counts as in force where the
    kernel reports it - C(/sys/module/<module>/parameters/<param>) for a module parameter
    (Documentation/ABI/stable/sysfs-module), C(/sys/kernel/mm/transparent_hugepage/enabled) for
    C(transparent_hugepage) - and only else by C(/proc/cmdline). Not in force but in the command line
    the boot configuration passes is C(pending reboot); in neither is C(drift).
  - With O(swap_off), adds a row for the active swap areas (C(/proc/swaps), man 5 proc); active areas are
    C(n/a) when swapoff(2) is not permitted here (no CAP_SYS_ADMIN in C(/proc/self/status) CapEff, man 7
    capabilities).
  - With O(fstab), adds a row for active swap lines in that fstab (third field C(swap), man 5 fstab).
  - O(sysctl_files) adds a row per sysctl.d file of ours - C(drift) when a file applied after it at boot
    (systemd-sysctl's order, sysctl.d(5)) or by C(sysctl --system) (C(/etc/sysctl.conf) last, sysctl(8))
    gives one of its keys another value.
  - O(files) compares persistent files byte for byte with the text the role writes (its own template
    rendered with C(lookup('ansible.builtin.template')), which renders as the C(template) module does).
  - O(units) turns the C(status) of C(ansible.builtin.systemd_service) into rows - wanted enabled and
    active; an enabled unit skipped by its start condition (for example C(ConditionPathExists=/dev/cpu_dma_latency)
    in a container) is C(n/a).
  - O(rows) are rows the caller already compared (persistent files, units, the kernel command line); they
    are checked for a valid status and returned first, in order.
  - RV(table) is the whole report, one line per row, for printing.
options:
  settings:
    type: list
    elements: dict
    default: []
    description:
      - Runtime values to compare, in the form the roles' own lists use (C(thp_settings),
        C(cpufreq_boost_knobs)).
    suboptions:
      key:
        description: Setting name in the table, dotted C(<role>.<setting>) as in the state file.
        type: str
        required: true
      path:
        description: Absolute sysfs/procfs path on the live system.
        type: str
        required: true
      value:
        description: Wanted value, as given to C(kernel_setting).
        type: str
        required: true
  swap_off:
    description: Add the row C(swap.active) (wanted C(none)).
    type: bool
    default: false
  fstab:
    description: fstab to check for active swap lines (row C(swap.fstab)); empty adds no row.
    type: str
    default: ""
  files:
    description: Persistent files and their wanted text.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: Setting name in the table.
        type: str
        required: true
      path:
        description: The file.
        type: str
        required: true
      content:
        description: Wanted text of the file (UTF-8).
        type: str
        required: true
  sysctl_files:
    description: Our sysctl.d files, whose keys no file applied after them may set to another value.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: Setting name in the table.
        type: str
        required: true
      path:
        description: Our file, in C(/etc/sysctl.d).
        type: str
        required: true
      settings:
        description: The keys it sets and their values.
        type: dict
        required: true
  units:
    description: systemd units that must be enabled and active.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: Setting name in the table.
        type: str
        required: true
      status:
        description: The C(status) returned by C(ansible.builtin.systemd_service) for the unit (systemd
          properties C(UnitFileState), C(ActiveState), C(ConditionResult); systemd.unit(5)).
        type: dict
        required: true
  boot_params:
    description: Kernel boot parameters to compare (rows C(grub.boot.<name>)); omit for none.
    type: dict
    suboptions:
      set:
        description: Parameters wanted, name to value (null for a bare flag), as the C(grub) role sets them.
        type: dict
        default: {}
      remove:
        description: Parameter names wanted absent.
        type: list
        elements: str
        default: []
      configured:
        description:
          - The command line the boot configuration passes at the next boot (RV(kernel_cmdline#module:cmdline)
            of the C(kernel_cmdline) module read without edits). Null when it is not known.
        type: str
      not_applicable:
        description: Why this host's kernel command line is not ours to compare (a container boots no kernel
          of its own); every row is then C(n/a) with this reason. Empty to compare.
        type: str
        default: ""
  service:
    description:
      - The inference service's drift check (roles/inference_service/tasks/verify.yml) as it read it; adds, per
        engine, rows C(<name>.answers) (a chat completion), C(<name>.started_after_files) (no file changed since
        the engine started) and C(<name>.unit) (as O(units)), C(<name>) being C(inference_service), or
        C(inference_service@<node>) with one engine per NUMA node; with no engine deployed, one C(n/a) row.
    type: dict
    suboptions:
      instances:
        description: The service's engines (C(unit) and C(node) of each), as module C(engine_adapter) decides them.
        type: list
        elements: dict
        required: true
      units:
        description: The results of C(ansible.builtin.systemd_service) over them, each with its C(__instance).
        type: list
        elements: dict
        default: []
      answers:
        description: The results of the chat completion asked of each deployed engine, each with its C(__instance).
        type: list
        elements: dict
        default: []
      stale:
        description: The results of C(unit-inputs.sh stale) for the same engines, in the same order.
        type: list
        elements: dict
        default: []
  rows:
    description:
      - Rows compared by the caller, each with C(setting), C(wanted), C(actual) (str) and C(status)
        (C(ok), C(drift), C(pending reboot) or C(n/a)), and C(reason) (str) for C(n/a).
    type: list
    elements: dict
    default: []
  sysroot:
    description: Directory the paths are resolved under (C(/) for the live system; a fixture tree in tests).
    type: path
    default: /
author: llmtune contributors
"""

EXAMPLES = r"""
- name: Compare THP with the running kernel
  tuning_drift:
    settings:
      - {key: thp.enabled, path: /sys/kernel/mm/transparent_hugepage/enabled, value: always}
    swap_off: true
    fstab: /etc/fstab
    rows:
      - {setting: swap.sysctl_file, wanted: /etc/sysctl.d/zz-llmtune-swap.conf as templated,
         actual: as templated, status: ok}
  register: drift

- name: Print the table
  ansible.builtin.debug:
    msg: "{{ drift.table }}"
"""

RETURN = r"""
rows:
  description: Every row, O(rows) and the answer and file rows of O(service) first, then O(files),
    O(sysctl_files), O(units) with the unit rows of O(service), O(settings), the swap rows, then O(boot_params).
  returned: always
  type: list
  elements: dict
  sample: [{"setting": "thp.enabled", "wanted": "always", "actual": "madvise", "status": "drift", "reason": ""}]
drift:
  description: Names of the rows whose status is C(drift).
  returned: always
  type: list
  elements: str
  sample: [thp.enabled]
pending:
  description: Names of the rows whose status is C(pending reboot).
  returned: always
  type: list
  elements: str
  sample: [grub.boot.intel_idle.max_cstate]
table:
  description: Aligned text table, header first; the status column reads C(n/a (reason)) for C(n/a) rows.
  returned: always
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_cmdline import (CmdlineError, effect_path, format_param, param_key, same_effect,
                                                  split_kernel_params)
from ansible.module_utils.llmtune_drift import PENDING, STATUSES, service_rows
from ansible.module_utils.llmtune_sysctl import describe, overriding_assignments
from ansible.module_utils.llmtune_sysfs import (has_capability, is_fstab_swap_line, kernel_value, parse_proc_swaps,
                                                read_text, sysroot_path)

CAP_SYS_ADMIN = 21  # include/uapi/linux/capability.h; swapon(2)/swapoff(2) need it
COLUMNS = ("setting", "wanted", "actual", "status")


def row(setting, wanted, actual, status, reason=""):
    """Return one table row (dict of str)."""
    return {"setting": setting, "wanted": wanted, "actual": actual, "status": status, "reason": reason}


def compare_setting(sysroot, name, path, wanted):
    """Compare one sysfs/procfs value with ``wanted``; return a row.

    Absent file: n/a (the kernel lacks the interface). Unreadable: n/a. Equal: ok. Different and not
    writable by us: n/a, since the role could not have set it either. Different otherwise: drift.
    """
    wanted = kernel_value(wanted)[0]
    full = sysroot_path(sysroot, path)
    if not os.path.exists(full):
        return row(name, wanted, "-", "n/a", "%s not present" % path)
    raw = read_text(sysroot, path)
    if raw is None:
        return row(name, wanted, "-", "n/a", "%s cannot be read" % path)
    actual = kernel_value(raw)[0]
    if actual == wanted:
        return row(name, wanted, actual, "ok")
    if not os.access(full, os.W_OK):
        return row(name, wanted, actual, "n/a", "read-only %s, the role cannot set it here" % path)
    return row(name, wanted, actual, "drift")


def compare_swap(sysroot):
    """Row ``swap.active``: active swap areas from /proc/swaps, wanted none."""
    areas = [area["filename"] for area in parse_proc_swaps(read_text(sysroot, "/proc/swaps", ""))]
    if not areas:
        return row("swap.active", "none", "none", "ok")
    if has_capability(read_text(sysroot, "/proc/self/status", ""), CAP_SYS_ADMIN) is False:
        return row("swap.active", "none", " ".join(areas), "n/a",
                   "swapoff not permitted (no CAP_SYS_ADMIN, e.g. a container)")
    return row("swap.active", "none", " ".join(areas), "drift")


def compare_fstab(sysroot, fstab):
    """Row ``swap.fstab``: swap lines left active in ``fstab``, wanted none."""
    full = sysroot_path(sysroot, fstab)
    if not os.path.exists(full):
        return row("swap.fstab", "no active swap line", "-", "n/a", "%s not present" % fstab)
    with open(full, encoding="utf-8", errors="replace") as handle:
        lines = [line.strip() for line in handle if is_fstab_swap_line(line)]
    if not lines:
        return row("swap.fstab", "no active swap line", "none", "ok")
    return row("swap.fstab", "no active swap line", " | ".join(lines), "drift")


def compare_file(sysroot, name, path, content):
    """Row for a persistent file compared byte for byte with ``content``; names the first differing line."""
    try:
        with open(sysroot_path(sysroot, path), "rb") as handle:
            actual = handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return row(name, "as templated", "absent: %s" % path, "drift")
    if actual == content:
        return row(name, "as templated", "as templated", "ok")
    have, want = actual.splitlines(), content.splitlines()
    number = next((i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
    line = have[number] if number < len(have) else "(end of file)"
    return row(name, "as templated", "%s line %d: %s" % (path, number + 1, line), "drift")


def compare_sysctl_order(sysroot, name, path, settings):
    """Row for our sysctl.d file ``path``: ok when no file applied after it overrides one of ``settings``."""
    wanted = "%s wins at boot" % path
    later = overriding_assignments(sysroot, path, settings)
    if not later:
        return row(name, wanted, "no later file sets %s" % ", ".join(sorted(settings)), "ok")
    return row(name, wanted, "; ".join(describe(assignment) for assignment in later), "drift")


def compare_unit(name, status):
    """Row for a systemd unit that must be enabled and active (``status``: systemd unit properties).

    An enabled unit whose start condition failed (``ConditionResult=no``, for example a path the
    container lacks) is n/a: systemd skips it by design there.
    """
    enabled = status.get("UnitFileState", "not-found")
    active = status.get("ActiveState", "inactive")
    actual = "%s, %s" % (enabled, active)
    if enabled != "enabled":
        return row(name, "enabled, active", actual, "drift")
    if active == "active":
        return row(name, "enabled, active", actual, "ok")
    if status.get("ConditionResult") == "no":
        return row(name, "enabled, active", actual, "n/a", "enabled; skipped by its start condition on this host")
    return row(name, "enabled, active", actual, "drift")


def _last_values(cmdline):
    """Map each parameter key of a command line to its last value (the kernel applies them in turn)."""
    return {param.key: param.value for param in split_kernel_params(cmdline)}


def compare_boot_params(sysroot, wanted, remove, configured, not_applicable):
    """Rows ``grub.boot.<name>``: each wanted parameter against the running kernel and the next boot.

    ``wanted`` maps name to value (str, None for a bare flag); ``remove`` lists names wanted absent;
    ``configured`` is the command line the boot configuration passes (str, None when unknown);
    ``not_applicable`` a reason (str) to make every row n/a. A parameter is in force when its effect file
    (:func:`effect_path`) reads its value, or, with no effect file, when ``/proc/cmdline`` has it. Not in
    force: ``pending reboot`` when ``configured`` has it, else drift. Raises CmdlineError for a bad name.
    """
    running = read_text(sysroot, "/proc/cmdline")
    rows = []
    params = [split_kernel_params(format_param(name, value))[0] for name, value in wanted.items()]
    for param in params:
        rows.append(_compare_boot_param(sysroot, param, running, configured, not_applicable))
    for name in remove:
        setting = "grub.boot.%s" % name
        if not_applicable:
            rows.append(row(setting, "-" + name, "-", "n/a", not_applicable))
        elif running is None:
            rows.append(row(setting, "-" + name, "-", "n/a", "/proc/cmdline cannot be read"))
        elif param_key(name) not in _last_values(running):
            rows.append(row(setting, "-" + name, "not on /proc/cmdline", "ok"))
        elif configured is not None and param_key(name) not in _last_values(configured):
            rows.append(row(setting, "-" + name, "on /proc/cmdline; the boot configuration drops it", PENDING))
        else:
            rows.append(row(setting, "-" + name, "on /proc/cmdline and in the boot configuration", "drift"))
    return rows


def _compare_boot_param(sysroot, param, running, configured, not_applicable):
    """One row of :func:`compare_boot_params` for the wanted :class:`Param` ``param``."""
    setting = "grub.boot.%s" % param.name
    if not_applicable:
        return row(setting, param.raw, "-", "n/a", not_applicable)
    if running is None:
        return row(setting, param.raw, "-", "n/a", "/proc/cmdline cannot be read")
    on_cmdline = _last_values(running).get(param.key, ()) == param.value
    next_boot = configured is not None and _last_values(configured).get(param.key, ()) == param.value
    path = effect_path(param.name)
    raw = read_text(sysroot, path) if path else None
    if raw is not None:
        actual = "%s: %s" % (path, kernel_value(raw)[0])
        if same_effect(kernel_value(raw)[0], param.value):
            return row(setting, param.raw, actual, "ok")
        if on_cmdline:
            return row(setting, param.raw, actual + " although /proc/cmdline has it", "drift")
        actual += ", not on /proc/cmdline"
    elif on_cmdline:
        if path:
            return row(setting, param.raw, "on /proc/cmdline", "n/a",
                       "%s cannot be read: module not loaded, no module parameter, or root only" % path)
        return row(setting, param.raw, "on /proc/cmdline", "ok")
    else:
        actual = "not on /proc/cmdline"
    if next_boot:
        return row(setting, param.raw, actual + "; the boot configuration has it", PENDING)
    return row(setting, param.raw, actual + "; the boot configuration lacks it"
               + (" (not computable)" if configured is None else ""), "drift")


def format_table(rows):
    """Align ``rows`` in columns under a header; an n/a row's status carries its reason."""
    cells = [COLUMNS] + [(r["setting"], r["wanted"], r["actual"],
                          "n/a (%s)" % r["reason"] if r["status"] == "n/a" else r["status"]) for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS) - 1)]
    return ["  ".join([cell.ljust(width) for cell, width in zip(line, widths)] + [line[-1]]).rstrip()
            for line in cells]


def main():
    module = AnsibleModule(
        argument_spec={
            "settings": {"type": "list", "elements": "dict", "default": [], "options": {
                "key": {"type": "str", "required": True, "no_log": False},
                "path": {"type": "str", "required": True},
                "value": {"type": "str", "required": True},
            }},
            "swap_off": {"type": "bool", "default": False},
            "fstab": {"type": "str", "default": ""},
            "files": {"type": "list", "elements": "dict", "default": [], "options": {
                "name": {"type": "str", "required": True},
                "path": {"type": "str", "required": True},
                "content": {"type": "str", "required": True},
            }},
            "sysctl_files": {"type": "list", "elements": "dict", "default": [], "options": {
                "name": {"type": "str", "required": True},
                "path": {"type": "str", "required": True},
                "settings": {"type": "dict", "required": True},
            }},
            "units": {"type": "list", "elements": "dict", "default": [], "options": {
                "name": {"type": "str", "required": True},
                "status": {"type": "dict", "required": True},
            }},
            "rows": {"type": "list", "elements": "dict", "default": []},
            "service": {"type": "dict", "options": {
                "instances": {"type": "list", "elements": "dict", "required": True},
                "units": {"type": "list", "elements": "dict", "default": []},
                "answers": {"type": "list", "elements": "dict", "default": []},
                "stale": {"type": "list", "elements": "dict", "default": []},
            }},
            "boot_params": {"type": "dict", "options": {
                "set": {"type": "dict", "default": {}},
                "remove": {"type": "list", "elements": "str", "default": []},
                "configured": {"type": "str"},
                "not_applicable": {"type": "str", "default": ""},
            }},
            "sysroot": {"type": "path", "default": "/"},
        },
        supports_check_mode=True,
    )
    params = module.params
    sysroot = params["sysroot"]
    rows = []
    given_rows, units = params["rows"], params["units"]
    if params["service"]:
        service = params["service"]
        service_units, service_given = service_rows(service["instances"], service["units"], service["answers"],
                                                    service["stale"])
        given_rows, units = given_rows + service_given, units + service_units
    for given in given_rows:
        missing = [key for key in COLUMNS if key not in given]
        if missing or given["status"] not in STATUSES or (given["status"] == "n/a" and not given.get("reason")):
            module.fail_json(msg="bad drift row %r: needs setting, wanted, actual, status (%s) "
                                 "and a reason for n/a" % (given, ", ".join(STATUSES)))
        rows.append(row(*(str(given[key]) for key in COLUMNS), reason=str(given.get("reason") or "")))
    rows += [compare_file(sysroot, f["name"], f["path"], f["content"]) for f in params["files"]]
    rows += [compare_sysctl_order(sysroot, f["name"], f["path"], f["settings"]) for f in params["sysctl_files"]]
    rows += [compare_unit(u["name"], u["status"]) for u in units]
    rows += [compare_setting(sysroot, s["key"], s["path"], s["value"]) for s in params["settings"]]
    if params["swap_off"]:
        rows.append(compare_swap(sysroot))
    if params["fstab"]:
        rows.append(compare_fstab(sysroot, params["fstab"]))
    boot = params["boot_params"]
    if boot:
        try:
            rows += compare_boot_params(sysroot, boot["set"], boot["remove"], boot["configured"],
                                        boot["not_applicable"])
        except CmdlineError as exc:
            module.fail_json(msg="boot_params: %s" % exc)
    module.exit_json(changed=False, rows=rows, table=format_table(rows),
                     drift=[r["setting"] for r in rows if r["status"] == "drift"],
                     pending=[r["setting"] for r in rows if r["status"] == PENDING])


if __name__ == "__main__":
    main()
