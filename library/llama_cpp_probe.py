#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module llama_cpp_probe: run a GGUF through llama.cpp's kernels once before serving it, and report them."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_cpp_probe
short_description: Check the CPU kernels llama.cpp picks for a GGUF file run on this host, and name them
description:
  - Runs C(llama-bench -v) of O(programs) on O(model) (a prefill of 8 tokens and 2 decoded ones, the kernels the
    service uses) and reports the kernel path it took, from llama.cpp's own output; parsing in
    C(module_utils/llmtune_kernels.py).
  - ggml picks its CPU backend variant (C(libggml-cpu-VARIANT.so)) by CPUID, but a host may advertise what it cannot
    run (on a Xeon VM whose CPUID shows C(amx_tile) and whose kernel grants XTILEDATA, the sapphirerapids variant's AMX
    int8 kernel died with SIGILL on C(tilezero) for q8_0 weights, while bf16 weights ran). A variant that dies with
    SIGILL is moved to C(O(programs)/disabled) (kept, not deleted) and the next best one is tried; RV(disabled) names
    each. The program's other failures fail the task with its output's last lines.
  - Changes the host only by moving such a variant (C(changed)). Check mode runs nothing.
version_added: "0.1.0"
author: llmtune project
options:
  programs:
    description: Folder of the llama.cpp build (C(llama-bench) and the C(libggml-cpu-*.so) variants beside it).
    type: path
    required: true
  model:
    description: The GGUF file to run.
    type: path
    required: true
  threads:
    description: Threads of the run.
    type: int
    default: 1
  timeout:
    description: Seconds a run may take.
    type: int
    default: 600
"""

EXAMPLES = r"""
- name: Check the kernels of the served GGUF
  llama_cpp_probe:
    programs: /opt/llmtune/llama.cpp-0.3.36-x86_64-abc
    model: /opt/llmtune/models/qwen3-0.6b-q8_0.gguf
    threads: 2
  register: probe
"""

RETURN = r"""
kernel:
  description: The kernel path of the last run.
  returned: success
  type: dict
  contains:
    variant: {description: The ggml CPU backend variant loaded (haswell, zen4, sapphirerapids, ...)., type: str}
    buffers: {description: MiB of the weights by buffer type (CPU_Mapped, CPU_REPACK, AMX)., type: dict}
    repacked: {description: Tensors repacked for a kernel, by layout (q4_0_8x8, ...)., type: dict}
    summary: {description: One line of the above, for the reports., type: str, sample: "ggml-cpu-haswell, q4_0_8x8 x130, CPU_REPACK 236.25 MiB"}
disabled:
  description: Variants set aside because they died with SIGILL, in the order tried.
  returned: success
  type: list
  elements: str
cpu_backend:
  description: The file of the variant that ran, e.g. libggml-cpu-zen4.so.
  returned: success
  type: str
"""

import os
import shutil
import signal
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_kernels import llama_cpp_summary, parse_llama_bench


class ProbeError(Exception):
    pass


def run_bench(params):
    argv = [os.path.join(params["programs"], "llama-bench"), "--model", params["model"], "--threads",
            str(params["threads"]), "--n-prompt", "8", "--n-gen", "2", "--repetitions", "1", "--verbose"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=params["timeout"],
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ProbeError(f"{' '.join(argv)}: {error}") from error
    return done.returncode, done.stdout + done.stderr


def probe(params):
    """(kernel, disabled): run until a variant runs, setting aside each that dies with SIGILL."""
    disabled = []
    while True:
        returncode, output = run_bench(params)
        path = parse_llama_bench(output)
        if returncode == -signal.SIGILL and path["variant"]:
            library = os.path.join(params["programs"], f"libggml-cpu-{path['variant']}.so")
            if not os.path.exists(library):
                raise ProbeError(f"llama-bench died with SIGILL in {library}, which is not there to set aside")
            os.makedirs(os.path.join(params["programs"], "disabled"), exist_ok=True)
            shutil.move(library, os.path.join(params["programs"], "disabled", os.path.basename(library)))
            disabled.append(path["variant"])
            continue
        if returncode:
            tail = "\n".join(output.splitlines()[-8:])
            raise ProbeError(f"llama-bench on {params['model']} exited with {returncode}:\n{tail}")
        return dict(path, summary=llama_cpp_summary(path)), disabled


def main():
    module = AnsibleModule(argument_spec={
        "programs": {"type": "path", "required": True},
        "model": {"type": "path", "required": True},
        "threads": {"type": "int", "default": 1},
        "timeout": {"type": "int", "default": 600},
    }, supports_check_mode=True)
    params = module.params
    if not os.access(os.path.join(params["programs"], "llama-bench"), os.X_OK):
        module.fail_json(msg=f"llama_cpp_probe: no llama-bench in {params['programs']}")
    if not os.path.isfile(params["model"]):
        module.fail_json(msg=f"llama_cpp_probe: model {params['model']} is not a file")
    if params["threads"] < 1:
        module.fail_json(msg="llama_cpp_probe: threads must be >= 1")
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="check mode: nothing run")
    try:
        kernel, disabled = probe(params)
    except (ProbeError, OSError) as error:
        module.fail_json(msg=f"llama_cpp_probe: {error}")
    module.exit_json(changed=bool(disabled), kernel=kernel, disabled=disabled,
                     cpu_backend=f"libggml-cpu-{kernel['variant']}.so" if kernel["variant"] else "")


if __name__ == "__main__":
    main()
