#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: turn every active swap area off (when memory can absorb it) and comment swap out of fstab."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: swap_off
short_description: Turn swap off now and comment swap entries out of /etc/fstab
description:
  - Reads C(/proc/swaps) and C(/proc/meminfo) (man 5 proc). When the swap in use plus O(memory_margin_mb)
    exceeds C(MemAvailable), fails with one line and changes nothing; otherwise calls swapoff(2) on every
    active swap area (partition, file, zram).
  - Comments out every swap line of O(fstab) (third field C(swap), whatever spaces or tabs separate the
    fields) by prefixing C(#llmtune# ), leaving all other lines byte for byte. The file is backed up once
    in the llmtune state directory before its first edit.
  - Records the active swap areas once as C(swap.areas) (file names, one a line) in the llmtune state
    file before turning them off, so a rollback can turn them on again.
  - When swapoff(2) is refused with EPERM (no CAP_SYS_ADMIN, for example in a container) the runtime step
    is skipped with C(runtime_reason) and the fstab edit still happens.
  - Supports check mode and diff (the fstab change).
options:
  fstab:
    description: fstab to edit. An empty string leaves fstab alone.
    type: str
    default: /etc/fstab
  swapoff:
    description: Turn active swap areas off now.
    type: bool
    default: true
  memory_margin_mb:
    description: MiB of C(MemAvailable) that must remain after the swapped-out pages come back into RAM.
    type: int
    default: 256
  sysroot:
    description: Directory C(/proc) and O(fstab) are resolved under (C(/) on a live system).
    type: path
    default: /
  state_path:
    description: llmtune state file recording the fstab backup and the active swap areas.
    type: path
    default: /var/lib/llmtune/state.json
author: llmtune contributors
"""

EXAMPLES = r"""
- name: Swap off now and at boot
  swap_off:
    memory_margin_mb: 512
"""

RETURN = r"""
swaps:
  description: Active swap areas before the task, as parsed from C(/proc/swaps).
  returned: always
  type: list
  elements: dict
  sample: [{"filename": "/dev/sda2", "type": "partition", "size_kb": 2097148, "used_kb": 1024, "priority": -2}]
swapped_off:
  description: Swap areas turned off (would be, in check mode).
  returned: always
  type: list
  elements: str
runtime_reason:
  description: Why active swap was left on (for example EPERM in a container); empty when not skipped.
  returned: always
  type: str
fstab_commented:
  description: The fstab lines commented out by this call.
  returned: always
  type: list
  elements: str
backup:
  description: Backup of the fstab taken before its first edit (null when not edited by this call).
  returned: always
  type: str
"""

import ctypes
import ctypes.util
import errno
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_state import backup_file, record_original
from ansible.module_utils.llmtune_sysfs import (comment_fstab_swap, parse_meminfo, parse_proc_swaps, read_text,
                                                sysroot_path)


def memory_shortfall_kb(swaps, meminfo, margin_kb):
    """Return how many KiB are missing for swapoff to fit in ``MemAvailable`` minus ``margin_kb`` (0 = fits).

    Swap in use comes back into RAM on swapoff; MemAvailable (kernel estimate, Documentation/filesystems/proc.rst)
    is what can take it without pushing out page cache the service needs. Falls back to MemFree on
    kernels older than 3.14 that lack MemAvailable.
    """
    used = sum(area["used_kb"] for area in swaps)
    available = meminfo.get("MemAvailable", meminfo.get("MemFree", 0))
    return max(0, used + margin_kb - available)


def swapoff(path):
    """Call swapoff(2) on ``path``; return 0 or the errno."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.swapoff(os.fsencode(path)) == 0:
        return 0
    return ctypes.get_errno()


def main():
    module = AnsibleModule(
        argument_spec={
            "fstab": {"type": "str", "default": "/etc/fstab"},
            "swapoff": {"type": "bool", "default": True},
            "memory_margin_mb": {"type": "int", "default": 256},
            "sysroot": {"type": "path", "default": "/"},
            "state_path": {"type": "path", "default": "/var/lib/llmtune/state.json"},
        },
        supports_check_mode=True,
    )
    params = module.params
    sysroot = params["sysroot"]
    swaps = parse_proc_swaps(read_text(sysroot, "/proc/swaps", ""))
    result = {"changed": False, "swaps": swaps, "swapped_off": [], "runtime_reason": "",
              "fstab_commented": [], "backup": None}

    if params["swapoff"] and swaps:
        meminfo = parse_meminfo(read_text(sysroot, "/proc/meminfo", ""))
        short = memory_shortfall_kb(swaps, meminfo, params["memory_margin_mb"] * 1024)
        if short:
            module.fail_json(msg="refusing swapoff: %d MiB of swap in use, MemAvailable %d MiB, margin %d MiB; "
                             "%d MiB short, nothing changed"
                             % (sum(a["used_kb"] for a in swaps) // 1024,
                                meminfo.get("MemAvailable", meminfo.get("MemFree", 0)) // 1024,
                                params["memory_margin_mb"], -(-short // 1024)), **result)
        # The rollback turns these areas on again (swapon); recorded once, before the first swapoff.
        record_original(params["state_path"], "swap.areas", "\n".join(a["filename"] for a in swaps),
                        module.check_mode)
        for area in swaps:
            code = 0 if module.check_mode else swapoff(area["filename"])
            if code in (errno.EPERM, errno.EACCES):
                result["runtime_reason"] = "swapoff not permitted (%s; no CAP_SYS_ADMIN, e.g. a container)" \
                    % os.strerror(code)
                break
            if code:
                module.fail_json(msg="swapoff %s failed: %s" % (area["filename"], os.strerror(code)), **result)
            result["swapped_off"].append(area["filename"])
            result["changed"] = True

    if params["fstab"]:
        fstab = sysroot_path(sysroot, params["fstab"])
        text = None
        if os.path.exists(fstab):
            # read whole, not read_text: every byte (trailing blank lines too) must survive the edit
            with open(fstab, encoding="utf-8") as handle:
                text = handle.read()
        if text is not None:
            new_text, commented = comment_fstab_swap(text)
            if commented:
                result.update(changed=True, fstab_commented=commented,
                              diff={"before": text, "after": new_text,
                                    "before_header": fstab, "after_header": fstab})
                if not module.check_mode:
                    result["backup"] = backup_file(params["state_path"], fstab)[1]["backup"]
                    tmp = fstab + ".llmtune.tmp"
                    with open(tmp, "w", encoding="utf-8") as handle:
                        handle.write(new_text)
                    module.atomic_move(tmp, fstab)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
