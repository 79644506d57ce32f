#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: turn active swap areas off (those memory can absorb) and comment swap out of fstab."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: swap_off
short_description: Turn swap off now and comment swap entries out of /etc/fstab
description:
  - Reads C(/proc/swaps) and C(/proc/meminfo) (man 5 proc). Calls swapoff(2) on every active swap area
    (partition, file, zram) whose pages fit in C(MemAvailable) minus O(memory_margin_mb), smallest use
    first, counting each area turned off against C(MemAvailable). An area that does not fit is left on,
    with a warning and C(reboot_required=true); the task does not fail, and the persistent change below
    still happens, so the next boot comes up without that swap.
  - Each swapoff(2) runs in a child process bounded by O(swapoff_timeout_s). Past it the child is killed;
    the kernel then stops moving pages back and puts the area back in service (mm/swapfile.c,
    C(try_to_unuse) returns on a fatal signal), so the area is left on, as for lack of memory. An C(ENOMEM)
    answer of the kernel, or a child killed by a signal (the OOM killer), counts the same.
  - Comments out every swap line of O(fstab) (third field C(swap), whatever spaces or tabs separate the
    fields) by prefixing C(#llmtune# ), leaving all other lines byte for byte. The file is backed up once
    in the llmtune state directory before its first edit.
  - Records the active swap areas once as C(swap.areas) (file names, one a line) in the llmtune state
    file before turning any off, so a rollback can turn them on again.
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
  swapoff_timeout_s:
    description: Seconds one swapoff(2) may take (it reads every swapped-out page back, from disk for a
      partition or file). Must be at least 1.
    type: int
    default: 300
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
    swapoff_timeout_s: 600
  register: swap_off_result

- name: Tell the operator a reboot finishes the job
  ansible.builtin.debug:
    msg: "swap stays on until the next reboot: {{ swap_off_result.runtime_reason }}"
  when: swap_off_result.reboot_required
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
left_on:
  description: Swap areas left on, each with the reason (lack of memory, a timeout or a signal, ENOMEM, EPERM).
  returned: always
  type: list
  elements: dict
  sample: [{"filename": "/dev/sda7", "reason": "not enough memory: 3417 MiB of swap in use, MemAvailable
            1181 MiB, margin 256 MiB (2493 MiB short)"}]
reboot_required:
  description: True when an area was left on for lack of memory, a timeout or a signal; it stays on until the
    next reboot, which comes up without it (fstab commented out).
  returned: always
  type: bool
runtime_reason:
  description: Why swap areas were left on (the C(left_on) reasons joined); empty when none was.
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
import multiprocessing
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_state import atomic_move_durably, backup_file, record_original
from ansible.module_utils.llmtune_sysfs import (comment_fstab_swap, parse_meminfo, parse_proc_swaps, read_text,
                                                sysroot_path)

# errno values fit an exit status; this one marks a child that failed before calling swapoff(2).
_CHILD_ERROR = 255


def available_kb(meminfo):
    """Return the KiB the kernel estimates can be allocated without swapping (``MemAvailable``).

    Source: Documentation/filesystems/proc.rst. Kernels older than 3.14 lack it: ``MemFree`` instead.
    """
    return meminfo.get("MemAvailable", meminfo.get("MemFree", 0))


def plan_swapoff(swaps, available, margin_kb):
    """Split active swap areas into those to turn off and those memory cannot absorb.

    swapoff brings an area's used pages back into RAM. Areas are taken smallest use first, each one
    counted against ``available`` (KiB), so as many fit as possible. Returns ``(turn_off, refused)``:
    a list of areas and a list of ``(area, short_kb)``, ``short_kb`` the KiB missing for that area.
    """
    turn_off = []
    refused = []
    for area in sorted(swaps, key=lambda a: a["used_kb"]):
        short = area["used_kb"] + margin_kb - available
        if short > 0:
            refused.append((area, short))
        else:
            turn_off.append(area)
            available -= area["used_kb"]
    return turn_off, refused


def _swapoff_child(path):
    """Child process body: swapoff(2) on ``path``; the exit status is 0 or the errno."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        code = 0 if libc.swapoff(os.fsencode(path)) == 0 else ctypes.get_errno()
    except BaseException:  # pylint: disable=broad-except
        code = _CHILD_ERROR
    os._exit(code)  # no atexit handlers or buffered output of the parent in the child


def swapoff(path, timeout_s):
    """Call swapoff(2) on ``path`` in a child process; return 0, the errno, or None after ``timeout_s`` seconds.

    On timeout the child is killed (SIGKILL); the kernel aborts the swapoff on the fatal signal and puts the
    area back in service, so nothing is left half done.
    """
    child = multiprocessing.get_context("fork").Process(target=_swapoff_child, args=(path,))
    child.start()
    child.join(timeout_s)
    if child.is_alive():
        child.kill()
        child.join()
        return None
    return child.exitcode


def main():
    module = AnsibleModule(
        argument_spec={
            "fstab": {"type": "str", "default": "/etc/fstab"},
            "swapoff": {"type": "bool", "default": True},
            "memory_margin_mb": {"type": "int", "default": 256},
            "swapoff_timeout_s": {"type": "int", "default": 300},
            "sysroot": {"type": "path", "default": "/"},
            "state_path": {"type": "path", "default": "/var/lib/llmtune/state.json"},
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["swapoff_timeout_s"] < 1:
        module.fail_json(msg="swapoff_timeout_s must be at least 1 (seconds), got %d" % params["swapoff_timeout_s"])
    sysroot = params["sysroot"]
    swaps = parse_proc_swaps(read_text(sysroot, "/proc/swaps", ""))
    result = {"changed": False, "swaps": swaps, "swapped_off": [], "left_on": [], "reboot_required": False,
              "runtime_reason": "", "fstab_commented": [], "backup": None}

    if params["swapoff"] and swaps:
        available = available_kb(parse_meminfo(read_text(sysroot, "/proc/meminfo", "")))
        margin_kb = params["memory_margin_mb"] * 1024
        turn_off, refused = plan_swapoff(swaps, available, margin_kb)
        for area, short in refused:
            result["left_on"].append({
                "filename": area["filename"],
                "reason": "not enough memory: %d MiB of swap in use, MemAvailable %d MiB, margin %d MiB "
                          "(%d MiB short)" % (area["used_kb"] // 1024, available // 1024,
                                              params["memory_margin_mb"], -(-short // 1024))})
            result["reboot_required"] = True
        # The rollback turns these areas on again (swapon); recorded once, before the first swapoff.
        record_original(params["state_path"], "swap.areas", "\n".join(a["filename"] for a in swaps),
                        module.check_mode)
        for number, area in enumerate(turn_off):
            code = 0 if module.check_mode else swapoff(area["filename"], params["swapoff_timeout_s"])
            if code in (errno.EPERM, errno.EACCES):
                reason = "swapoff not permitted (%s; no CAP_SYS_ADMIN, e.g. a container)" % os.strerror(code)
                result["left_on"] += [{"filename": a["filename"], "reason": reason} for a in turn_off[number:]]
                break
            if code is None or code < 0 or code == errno.ENOMEM:
                if code is None:
                    reason = "swapoff timed out after %d s, the kernel kept the area" % params["swapoff_timeout_s"]
                elif code < 0:  # the OOM killer, for one
                    reason = "swapoff killed by signal %d, the kernel kept the area" % -code
                else:
                    reason = "swapoff refused by the kernel: %s" % os.strerror(code)
                result["left_on"].append({"filename": area["filename"], "reason": reason})
                result["reboot_required"] = True
                continue
            if code:
                reason = os.strerror(code) if code != _CHILD_ERROR else "could not call swapoff(2)"
                module.fail_json(msg="swapoff %s failed: %s" % (area["filename"], reason), **result)
            result["swapped_off"].append(area["filename"])
            result["changed"] = True
        result["runtime_reason"] = "; ".join("%s: %s" % (a["filename"], a["reason"]) for a in result["left_on"])
        if result["reboot_required"]:
            module.warn("swap left on until the next reboot: " + result["runtime_reason"])

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
                    atomic_move_durably(module, tmp, fstab)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
