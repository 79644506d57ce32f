#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: set one sysfs/procfs value at runtime, validated, with its original recorded once."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_setting
short_description: Set a sysfs or procfs value at runtime, validated against the kernel's own choices
description:
  - Reads the current value of one kernel file (for example
    C(/sys/kernel/mm/transparent_hugepage/enabled) or C(/proc/sys/vm/swappiness)), writes the wanted value
    when it differs, and records the original once in the llmtune state file first.
  - Choice files that bracket the selected word (C(always [madvise] never), see
    Documentation/admin-guide/mm/transhuge.rst) are parsed; the wanted value must be one of the listed
    choices, otherwise the task fails naming the allowed values. O(choices_path) adds the same check for
    files whose choices live in a sibling file (cpufreq C(scaling_available_governors),
    C(energy_performance_available_preferences); Documentation/admin-guide/pm/cpufreq.rst).
  - A missing file is not an error (the kernel lacks that interface), C(applied=false) with a one-line
    C(reason) ending in C(not present). A file that cannot be written because the file system is
    read-only or the caller lacks the right (EROFS, EACCES, EPERM; for example C(/sys) in an unprivileged
    container) is not an error either, C(applied=false), C(reason) starting with C(read-only).
  - C(changed) is true only when the module wrote (or in check mode would write). Supports diff.
options:
  path:
    description: Absolute path of the sysfs/procfs file, as on the live system.
    type: str
    required: true
  value:
    description: Wanted value, written as-is (no newline added). Compared to the current value with runs of
      white space collapsed. A choice file's whole text (C(always [madvise] never), as the state file records
      an original) means its bracketed word, so a rollback passes recorded originals unchanged.
    type: str
    required: true
  choices_path:
    description: File listing the allowed values separated by spaces; the value must be one of them.
      Ignored when that file is absent or empty.
    type: str
  sysroot:
    description: Directory the paths are resolved under (C(/) for the live system; a fixture tree in tests).
    type: path
    default: /
  state_path:
    description: llmtune state file where the original is recorded.
    type: path
    default: /var/lib/llmtune/state.json
  state_key:
    description: Dotted key C(<role>.<setting>) under which the original (whole file text) is recorded,
      with O(path) as C(kernel_path) so a rollback knows where to write it back. Nothing is recorded when
      omitted.
    type: str
notes:
  - Runtime only. The roles keep values across reboots with sysctl.d, tmpfiles.d or a oneshot unit.
  - After writing, the file is read back; a value the kernel silently kept different is reported as a warning.
author: llmtune contributors
"""

EXAMPLES = r"""
- name: THP off at runtime
  kernel_setting:
    path: /sys/kernel/mm/transparent_hugepage/enabled
    value: never
    state_key: thp.enabled

- name: Governor performance on policy0, if the driver offers it
  kernel_setting:
    path: /sys/devices/system/cpu/cpufreq/policy0/scaling_governor
    choices_path: /sys/devices/system/cpu/cpufreq/policy0/scaling_available_governors
    value: performance
    state_key: cpufreq.policy0.scaling_governor
"""

RETURN = r"""
applied:
  description: True when the file now holds the value (already did, or was written). False with a C(reason)
    when the file is absent or read-only.
  returned: always
  type: bool
reason:
  description: One line saying why the value was not applied (C(... not present) or C(read-only ...)).
  returned: when applied is false
  type: str
  sample: "read-only: /sys/kernel/mm/transparent_hugepage/enabled (Read-only file system)"
before:
  description: Current value before the task (the bracketed word for choice files).
  returned: when the file is readable
  type: str
  sample: madvise
after:
  description: Value read back after writing (equal to O(value) in check mode).
  returned: when applied is true
  type: str
choices:
  description: Values the kernel lists for this file (empty when it lists none).
  returned: when the file is readable
  type: list
  elements: str
  sample: [always, madvise, never]
original_recorded:
  description: Whether the original was recorded in the state file by this call.
  returned: always
  type: bool
"""

import errno
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_state import record_original
from ansible.module_utils.llmtune_sysfs import kernel_value, parse_word_list, read_text, sysroot_path

READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "str", "required": True},
            "value": {"type": "str", "required": True},
            "choices_path": {"type": "str"},
            "sysroot": {"type": "path", "default": "/"},
            "state_path": {"type": "path", "default": "/var/lib/llmtune/state.json"},
            "state_key": {"type": "str", "no_log": False},
        },
        supports_check_mode=True,
    )
    params = module.params
    path, sysroot = params["path"], params["sysroot"]
    wanted = kernel_value(params["value"])[0]
    full = sysroot_path(sysroot, path)
    result = {"changed": False, "applied": False, "original_recorded": False}

    if not os.path.exists(full):
        module.exit_json(reason="%s not present" % path, **result)
    raw = read_text(sysroot, path)
    if raw is None:
        module.exit_json(reason="read-only: %s cannot be read" % path, **result)
    before, choices = kernel_value(raw)
    if params["choices_path"]:
        choices = parse_word_list(read_text(sysroot, params["choices_path"])) or choices
    result.update(before=before, choices=choices)
    if choices and wanted not in choices:
        module.fail_json(msg="%s: value '%s' is not offered by the kernel; allowed: %s"
                         % (path, wanted, ", ".join(choices)), **result)
    if before == wanted:
        module.exit_json(**dict(result, applied=True, after=before))

    diff = {"before": "%s: %s\n" % (path, before), "after": "%s: %s\n" % (path, wanted)}
    if module.check_mode:
        if not os.access(full, os.W_OK):
            module.exit_json(reason="read-only: %s (not writable)" % path, **result)
        if params["state_key"]:
            result["original_recorded"] = record_original(params["state_path"], params["state_key"], raw, True,
                                                          kernel_path=path)[0]
        module.exit_json(**dict(result, changed=True, applied=True, after=wanted, diff=diff))

    try:
        handle = open(full, "w", encoding="utf-8")
    except OSError as err:
        if err.errno in READ_ONLY_ERRNOS:
            module.exit_json(reason="read-only: %s (%s)" % (path, err.strerror), **result)
        module.fail_json(msg="cannot open %s for writing: %s" % (path, err.strerror), **result)
    try:
        if params["state_key"]:
            result["original_recorded"] = record_original(params["state_path"], params["state_key"], raw,
                                                          kernel_path=path)[0]
        with handle:
            handle.write(wanted)
    except (OSError, ValueError) as err:
        module.fail_json(msg="writing '%s' to %s failed: %s" % (wanted, path, getattr(err, "strerror", None) or err),
                         **result)
    after = kernel_value(read_text(sysroot, path, ""))[0]
    if after != wanted:
        module.warn("%s reads back '%s' after writing '%s'" % (path, after, wanted))
    module.exit_json(**dict(result, changed=True, applied=True, after=after, diff=diff))


if __name__ == "__main__":
    main()
