#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module weights_mlock: how much memory an engine's unit may lock for its weights here, or why none."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: weights_mlock
short_description: Size the memory lock of an engine's weights, where systemd may raise a unit's limit to it
description:
  - The size is the weights file rounded up to MiB, plus 16 MiB.
  - Only a real unit shows the limit systemd could set. Where it may not raise it (an unprivileged container lacks
    C(CAP_SYS_RESOURCE); podman's hard limit is 8 MiB) it starts the unit with the lower one, silently
    (systemd.exec(5) C(LimitMEMLOCK=), setrlimit(2)). So the module starts C(grep Max locked memory /proc/self/limits)
    in a transient unit with that limit (C(systemd-run --wait --pipe)), also in check mode, since it changes nothing.
  - RV(bytes) is 0, and RV(skipped) says why, when the engine cannot lock its weights, the operator said no, the
    file is not on the host yet (check mode), or systemd could not raise the limit (or C(systemd-run) is missing).
options:
  path:
    description: The weights file on the host (the GGUF file).
    type: path
    required: true
  engine:
    description: The engine, named in RV(skipped).
    type: str
    required: true
  engine_locks:
    description: Whether the engine has an option to lock its weights (its adapter's C(mlock)).
    type: bool
    required: true
  wanted:
    description: The operator's choice (inference_service_mlock).
    type: bool
    default: true
author:
  - llmtune
"""

EXAMPLES = r"""
- name: Size the memory lock for the weights
  weights_mlock:
    path: /opt/llmtune/models/qwen3-0.6b-q8_0.gguf
    engine: llama_cpp
    engine_locks: true
  register: mlock
"""

RETURN = r"""
bytes:
  description: The memory lock the unit sets (C(LimitMEMLOCK=)); 0 when the weights are not locked.
  returned: always
  type: int
  sample: 672137216
skipped:
  description: Why the weights are not locked; empty when they are.
  returned: always
  type: str
  sample: "systemd could not raise the memlock limit to 672137216 bytes here (Max locked memory 8388608 8388608 bytes)"
"""

import os

from ansible.module_utils.basic import AnsibleModule

MIB = 1048576


def wanted_bytes(size):
    """The weights rounded up to MiB, plus 16 MiB."""
    return (-(-size // MIB) + 16) * MIB


def granted(limits_line, want):
    """Whether the hard limit of a /proc/PID/limits line ("Max locked memory  <soft>  <hard>  bytes") is WANT or
    more."""
    fields = limits_line.split()
    hard = fields[4] if len(fields) > 4 else "0"
    return hard == "unlimited" or (hard.isdigit() and int(hard) >= want)


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "engine": {"type": "str", "required": True},
            "engine_locks": {"type": "bool", "required": True},
            "wanted": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    if not params["engine_locks"]:
        module.exit_json(changed=False, bytes=0, skipped=f"{params['engine']} has no option to lock its weights")
    if not params["wanted"]:
        module.exit_json(changed=False, bytes=0, skipped="inference_service_mlock is false")
    if not os.path.exists(params["path"]):
        module.exit_json(changed=False, bytes=0, skipped="the GGUF file is not on the host yet (check mode)")
    want = wanted_bytes(os.path.getsize(params["path"]))
    systemd_run = module.get_bin_path("systemd-run")
    if not systemd_run:
        module.exit_json(changed=False, bytes=0, skipped="systemd-run is not on this host, so the limit systemd may "
                                                         "set is not known")
    rc, out, err = module.run_command([systemd_run, "--wait", "--pipe", "--quiet", "--collect",
                                       f"--property=LimitMEMLOCK={want}", "grep", "Max locked memory",
                                       "/proc/self/limits"])
    if rc == 0 and granted(out, want):
        module.exit_json(changed=False, bytes=want, skipped="")
    module.exit_json(changed=False, bytes=0, skipped=f"systemd could not raise the memlock limit to {want} bytes "
                                                     f"here ({' '.join(out.split()) or err.strip()})")


if __name__ == "__main__":
    main()
