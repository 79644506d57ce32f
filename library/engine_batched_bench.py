#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module engine_batched_bench: the served engine's own batched benchmark (llama.cpp, vLLM), beside the
service."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_batched_bench
short_description: Run the served engine's own batched benchmark as the service runs it and compare the two
description:
  - Reads what a systemd service runs with C(systemctl show) (its C(ExecStart), C(Environment), C(User),
    C(CPUAffinity), C(Slice)) and runs the same engine's own batched benchmark with the server's options,
    environment, user, CPU pinning and slice.
  - For C(llama-server), C(llama-batched-bench) of the same build folder (llama.cpp's C(tools/batched-bench)) with
    the same GGUF, threads, batch and micro-batch sizes, flash attention, cache types and load mode; the server-only
    options (host, port, alias, slots, web UI, metrics, key) are left out.
  - For vLLM's OpenAI server (C(python -m vllm.entrypoints.openai.api_server)), one offline engine of vLLM
    (C(LLM.from_engine_args), as C(vllm bench latency) builds it) in the same Python with the server's engine
    arguments (parsed by vLLM's own C(EngineArgs) parser; HTTP options are not engine arguments), given B prompts of
    random token ids at once (new ones each run, so no prefix-cache hit) with the sampling the server applies; the
    median of 3 runs after a warm-up, once with all output tokens and once with 1 (the prefill). Its weights, KV cache
    and compiled graphs (from the unit's cache) are a second copy beside the service, so it runs only where
    C(MemAvailable) holds the service's resident memory again and O(memory_margin_mb), else it is skipped saying so.
  - It decodes B streams of O(prompt_tokens)-token prompts (each its own, not shared) and O(output_tokens) output
    tokens each, for every B of O(concurrency), and reports each B's output tokens/s with the prefill included,
    B x O(output_tokens) / (prefill + decode seconds). A streamed request of N output tokens is one prefill, whose
    logits give the first token, and N - 1 decode steps, so C(-ntg) is N - 1. The context holds the largest B
    (B x (prompt + decode) cells), at least the server's C(--ctx-size).
  - With O(service_levels), the levels of an C(inference_benchmark) capacity sweep of the same service measured
    just before, compares each level's aggregate output tokens/s with the engine's own at the same number of
    streams (module_utils/llmtune_capacity.py) and names each gap beyond O(max_gap_percent).
  - Holds the benchmark lock (O(lock_path), as C(inference_benchmark) does) while it runs, and splits the host's CPU
    time meanwhile (C(/proc/stat)) into the benchmark's and everything else's, as C(inference_benchmark) does; a run
    during which other processes kept more than O(busy_limit) CPUs busy, or steal passed 5 %, is RV(noisy), and a
    gap it leaves is named so.
  - Never changes the host (C(changed) is always false). A service that runs another engine, a build without
    C(llama-batched-bench) or too little memory gives RV(skipped) with the reason. In check mode nothing runs.
version_added: "0.3.0"
author: llmtune project
options:
  unit:
    description:
      - The systemd service running C(llama-server) or vLLM's OpenAI server, with or without C(.service).
    type: str
    default: llm-inference
  concurrency:
    description:
      - Numbers of parallel streams (C(-npl)), for example the levels of the capacity sweep.
    type: list
    elements: int
    required: true
  prompt_tokens:
    description:
      - Prompt tokens of each stream (C(-npp)); the service's sweep counted its prompts with the chat template.
    type: int
    required: true
  output_tokens:
    description:
      - Output tokens of each stream, as C(max_tokens) of the service's requests (at least 2).
    type: int
    required: true
  service_levels:
    description:
      - The C(levels) of an C(inference_benchmark) capacity sweep of the service, to compare with; empty
        compares nothing.
    type: list
    elements: dict
    default: []
  max_gap_percent:
    description:
      - Percent the service's aggregate output tokens/s may differ from the engine's own before the gap is named.
    type: float
    default: 10
  busy_limit:
    description:
      - CPUs other processes may keep busy while it runs before the run is marked noisy.
    type: float
    default: 0.25
  timeout:
    description:
      - Seconds the engine's own benchmark may run, its start included.
    type: float
    default: 1800
  memory_margin_mb:
    description:
      - MiB that must stay free beside a second copy of the service's resident memory (its process tree's
        C(VmRSS)) for the engine's own run to start, as for the direct-run twin (C(engine_direct)).
    type: int
    default: 512
  lock_path:
    description:
      - The benchmark lock (see C(inference_benchmark)); empty locks nothing.
    type: path
    default: /run/llmtune/benchmark.lock
  lock_timeout:
    description:
      - Seconds to wait for another benchmark to release O(lock_path).
    type: float
    default: 1800
seealso:
  - name: llama.cpp batched-bench
    link: https://github.com/ggml-org/llama.cpp/tree/master/tools/batched-bench
  - name: vLLM offline inference
    link: https://docs.vllm.ai/en/latest/serving/offline_inference.html
"""

EXAMPLES = r"""
- name: Sweep the service's concurrency at the targets
  inference_benchmark:
    server: llama_cpp
    prompt_tokens: 128
    max_tokens: 32
    ignore_eos: true
    capacity: true
    target_ttft_p95_ms: 2000
    target_itl_p95_ms: 100
  register: sweep

- name: The same engine's own batched figure at the same streams
  engine_batched_bench:
    unit: llm-inference
    concurrency: "{{ sweep.levels | map(attribute='concurrency') | list }}"
    prompt_tokens: "{{ sweep.levels[0].prompt_tokens_mean | round | int }}"
    output_tokens: 32
    service_levels: "{{ sweep.levels }}"
"""

RETURN = r"""
skipped:
  description: True when nothing ran (check mode, another engine, no C(llama-batched-bench), too little memory).
  returned: when nothing ran
  type: bool
msg:
  description: Why nothing ran.
  returned: when nothing ran
  type: str
tool:
  description: What ran, C(llama-batched-bench) or C(vLLM LLM.generate).
  returned: success
  type: str
argv:
  description: The command run (without the C(systemd-run) scope around it; for vLLM the script is left out).
  returned: success
  type: list
  elements: str
user:
  description: User it ran as (the unit's).
  returned: success
  type: str
cpus:
  description: CPUs it was pinned to (the unit's CPUAffinity; all when it has none).
  returned: success
  type: list
  elements: int
slots:
  description: The server's C(--parallel) (vLLM C(--max-num-seqs)), the streams it decodes together (null when not
    set).
  returned: success
  type: int
server_context:
  description: The server's C(--ctx-size) (vLLM C(--max-model-len)) (null when not set); the benchmark's is in
    RV(argv).
  returned: success
  type: int
prompt_tokens:
  description: O(prompt_tokens).
  returned: success
  type: int
output_tokens:
  description: O(output_tokens).
  returned: success
  type: int
max_gap_percent:
  description: O(max_gap_percent).
  returned: success
  type: float
started:
  description: UTC start, ISO 8601.
  returned: success
  type: str
seconds:
  description: Seconds it ran, model load included.
  returned: success
  type: float
cpu:
  description: CPU use while it ran, in CPUs, C(engine) (the engine's own run), C(benchmark) (this module), C(other)
    and C(steal_percent).
  returned: success
  type: dict
noisy:
  description: True when other processes used more than O(busy_limit) CPUs or steal exceeded 5 % while it ran.
  returned: success
  type: bool
rows:
  description: One per B of O(concurrency), as llama-batched-bench reported it (C(pp), C(tg), C(pl) = B, C(t_pp),
    C(t_tg), C(t) seconds, C(speed_pp), C(speed_tg), C(speed) tokens/s, C(n_kv_max), C(n_batch), C(n_ubatch),
    C(n_threads), C(n_threads_batch); vLLM's run gives the first nine) and C(output_tokens_per_s), its output
    tokens/s with the prefill included.
  returned: success
  type: list
  elements: dict
comparison:
  description: Per level of O(service_levels), C(concurrency), C(service_tokens_per_s), C(engine_tokens_per_s),
    C(engine_decode_tokens_per_s) (decode alone), C(gap_percent) (100 x (1 - service / engine); negative when the
    service was faster), C(verdict) (C(within), C(beyond) or C(not measured)), C(reason), what the gap comes from
    when it is beyond O(max_gap_percent), and C(phases), the prefill and the decode apart (null when not measured).
    C(prefill) has C(service_tokens_per_s) (the engine's own timing of the served prompts, null where it reports
    none), C(client_tokens_per_s) (prompt tokens over TTFT p50), C(engine_tokens_per_s) (the row's C(speed_pp)),
    C(ratio) and C(client_ratio); C(decode) has C(service_tokens_per_s) (the requests' median per stream),
    C(engine_tokens_per_s) (C(speed_tg) / B) and C(ratio).
  returned: success
  type: list
  elements: dict
  sample:
    - {concurrency: 4, service_tokens_per_s: 31.2, engine_tokens_per_s: 33.0, engine_decode_tokens_per_s: 35.1,
       gap_percent: 5.5, verdict: within, reason: null}
"""

import datetime
import os
import resource
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_capacity import (VLLM_BATCHED, VLLM_SERVER_MODULE, batched_bench_argv,
                                                   compare_with_engine, engine_output_rate, parse_batched_bench,
                                                   vllm_batched_argv)
from ansible.module_utils.llmtune_cpuload import cpu_sample, cpu_split, is_noisy, memory_short
from ansible.module_utils.llmtune_lock import LockError, hold_lock
from ansible.module_utils.llmtune_systemd import (SHOW_PROPERTIES, UnitError, find_systemd_run, parse_show,
                                                  unit_command, unit_process)

ROW_KEYS = ("pp", "tg", "pl", "n_kv", "t_pp", "t_tg", "t", "speed_pp", "speed_tg", "speed", "n_kv_max", "n_batch",
            "n_ubatch", "n_threads", "n_threads_batch", "flash_attn")


def plan(params, show, proc="/proc"):
    """What to run for the unit's `systemctl show` SHOW: (tool, argv, environment additions, user, group, CPUs, slots,
    server context), or a str saying why nothing can run."""
    argv, env, user, group, cpus = unit_command(show)
    sizes = (params["concurrency"], params["prompt_tokens"], params["output_tokens"])
    if any(arg.endswith("llama-server") for arg in argv):
        bench, slots, context = batched_bench_argv(argv, *sizes)
        program = next(arg for arg in bench if arg.endswith("llama-batched-bench"))
        if not os.access(program, os.X_OK):
            return f"no {program}: the build was made before llama-batched-bench was kept"
        return "llama-batched-bench", bench, env, user, group, cpus, slots, context
    if argv[1:3] == ["-m", VLLM_SERVER_MODULE]:
        short = memory_short(int(show.get("MainPID") or 0), params["memory_margin_mb"], proc,
                             "vLLM's own batched run (a second engine)")
        if short:
            return short
        bench, slots, context = vllm_batched_argv(argv, *sizes)
        return "vLLM LLM.generate", bench, env, user, group, cpus, slots, context
    return (f"the service runs {os.path.basename(argv[0])}, neither llama-server nor vLLM's OpenAI server: no "
            "batched benchmark of its own")


def run_bench(params, show, systemd_run=None):
    """Run the engine's own batched benchmark as the unit runs its engine; returns the module's result (without
    changed)."""
    planned = plan(params, show)
    if isinstance(planned, str):
        return {"skipped": True, "msg": planned}
    tool, argv, env_add, user, group, cpus, slots, context = planned
    in_slice = show.get("Slice") if systemd_run else None
    run_argv, env, become = unit_process(argv, env_add, user, group, cpus, in_slice, systemd_run)
    lock, _waited = hold_lock(params["lock_path"], params["lock_timeout"])
    started, clock = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), time.monotonic()
    before, children = cpu_sample([]), child_cpu_s()
    try:
        done = subprocess.run(run_argv, env=env, cwd="/", stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              preexec_fn=become, timeout=params["timeout"], check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise UnitError(f"{tool} did not run to its end: {error}") from error
    finally:
        if lock:
            lock.close()
    cpu = engine_split(cpu_split(before, cpu_sample([])), child_cpu_s() - children, time.monotonic() - clock)
    seconds = round(time.monotonic() - clock, 1)
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise UnitError(f"{tool} exited with status {done.returncode}: {tail}")
    try:
        rows = [dict({key: row.get(key) for key in ROW_KEYS}, output_tokens_per_s=engine_output_rate(row))
                for row in parse_batched_bench(done.stdout)]
    except ValueError as error:
        raise UnitError(f"{error}: {done.stdout.strip()[-300:]}") from error
    noisy = is_noisy(cpu, params["busy_limit"])
    return {"tool": tool, "argv": [arg for arg in argv if arg != VLLM_BATCHED], "user": user,
            "cpus": sorted(cpus or os.sched_getaffinity(0)), "slots": slots, "server_context": context,
            "prompt_tokens": params["prompt_tokens"], "output_tokens": params["output_tokens"],
            "max_gap_percent": params["max_gap_percent"], "started": started, "seconds": seconds, "rows": rows,
            "cpu": cpu, "noisy": noisy,
            "comparison": compare_with_engine(params["service_levels"], rows, slots, params["max_gap_percent"], noisy,
                                              tool)}


def child_cpu_s():
    """CPU seconds of this process's ended and waited-for children (getrusage(2) RUSAGE_CHILDREN)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def engine_split(split, engine_cpu_s, wall_s):
    """SPLIT (cpu_split without engine processes, so the child counted as other) with the child's ENGINE_CPU_S over
    WALL_S seconds as the engine's."""
    engine = engine_cpu_s / max(wall_s, 1e-9)
    return dict(split, engine=round(engine, 3), other=round(max(0.0, split["other"] - engine), 3))


def check_options(params):
    """One-line error for bad options, or None."""
    if not params["concurrency"] or min(params["concurrency"]) < 1:
        return "concurrency must be a non-empty list of integers >= 1"
    if params["prompt_tokens"] < 1 or params["output_tokens"] < 2:
        return "prompt_tokens must be >= 1 and output_tokens >= 2"
    if min(params["max_gap_percent"], params["busy_limit"], params["memory_margin_mb"]) < 0 or params["timeout"] <= 0:
        return "max_gap_percent, busy_limit and memory_margin_mb must be >= 0, timeout > 0"
    return None


ARGUMENT_SPEC = {
    "unit": {"type": "str", "default": "llm-inference"},
    "concurrency": {"type": "list", "elements": "int", "required": True},
    "prompt_tokens": {"type": "int", "required": True},
    "output_tokens": {"type": "int", "required": True},
    "service_levels": {"type": "list", "elements": "dict", "default": []},
    "max_gap_percent": {"type": "float", "default": 10},
    "busy_limit": {"type": "float", "default": 0.25},
    "timeout": {"type": "float", "default": 1800},
    "memory_margin_mb": {"type": "int", "default": 512},
    "lock_path": {"type": "path", "default": "/run/llmtune/benchmark.lock"},
    "lock_timeout": {"type": "float", "default": 1800},
}


def main():
    """Run the engine's own batched benchmark; nothing on the host changes."""
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    problem = check_options(params)
    if problem:
        module.fail_json(msg=problem)
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="check mode: nothing run")
    unit = params["unit"] if params["unit"].endswith(".service") else params["unit"] + ".service"
    rc, out, err = module.run_command(["systemctl", "show", unit, "--no-pager"]
                                      + [f"--property={name}" for name in SHOW_PROPERTIES])
    if rc != 0:
        module.fail_json(msg=f"systemctl show {unit} failed: {err.strip()}")
    try:
        module.exit_json(changed=False, **run_bench(params, parse_show(out), find_systemd_run()))
    except (UnitError, LockError) as error:
        module.fail_json(msg=str(error))


if __name__ == "__main__":
    main()
