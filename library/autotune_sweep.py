#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module autotune_sweep: the auto-tune's plan, rows, choice and stored result on the host."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: autotune_sweep
short_description: Plan the auto-tune's rows within its time budget, record each, choose, and store the result
description:
  - The decisions of the autotune role, called once per step of its sweep; the role deploys each row's setting
    (role inference_service) and measures it (role benchmark) between the calls. The logic is in
    C(module_utils/llmtune_autotune.py).
  - O(action=start) reads the result stored at O(state_path). It holds while what it measured is unchanged (the CPU
    and topology, the model files, the engines' versions and build, the allowed stacks, the workload, the twin
    settings, this sweep's method) and its chosen setting deploys (the inference_service variables it maps to pass
    O(service_argument_spec)); then RV(holds) is true and RV(result) and RV(report) are the stored ones. Otherwise, or
    with O(remeasure), it returns a new sweep's RV(state) and RV(changed_inputs) names what changed.
  - O(action=next) returns RV(row), the next setting to measure, or null when the sweep is done. The order is every
    allowed engine's most promising stack (its first format in the measuring order, at the recommended threads and
    CPUs), then the engine defaults (the
    reference of the gain), then the other stacks, then the best one with other thread counts, each allocator, its
    batching (with more than one request in flight), one engine per NUMA node (two or more nodes and an API key),
    and float32 stacks last where the CPU computes bf16 natively. After each stage the setting kept so far is chosen
    again. Rows not started within O(config.budget_s) are recorded as skipped, but for each engine's first row, which is
    measured anyway. Each row gets a deadline after which
    the benchmark adds no paired round with its twin (RV(row.twin_deadline)); the first rows and the reference share
    what is left of the budget evenly, the others may use all of it.
  - O(action=record) adds the measurement of the row O(action=next) returned (or its failure) to the state. A row
    that another process disturbed (noisy) is planned once more, unless the host stayed busy through the whole wait
    before it; rows measured under load then say so. Each engine's peak resident memory is read from
    C(/proc/PID/status) (C(VmHWM), proc(5)) of O(measurement.engine_pids).
  - O(action=finish) makes the result and writes it to O(state_path) (atomically) only when its chosen setting
    deploys; it fails, after returning the result and report, when nothing could be chosen or the choice would not
    deploy, so such a result is never stored.
  - O(action=discard) sets the stored result aside (O(state_path) renamed to C(<state_path>.failed), with
    O(reason)) after its deploy failed, so the next sweep measures again.
  - C(changed) is true only when O(action=finish) or O(action=discard) wrote a file.
version_added: "0.3.0"
author: llmtune project
options:
  action:
    description: The step of the sweep.
    type: str
    required: true
    choices: [start, next, record, finish, discard]
  state_path:
    description: The stored result (JSON).
    type: path
    default: /var/lib/llmtune/autotune.json
  baseline_path:
    description: The untuned baseline the benchmark role stored, quoted in the report when present.
    type: path
    default: /var/lib/llmtune/baseline.json
  remeasure:
    description: With O(action=start), measure again even when the stored result holds.
    type: bool
    default: false
  config:
    description:
      - With O(action=start), the operator's choices (keys C(engines), C(dtypes), C(gguf_types),
        C(allow_quantized), C(quality_bounds), C(validation_floor), C(memory_budget_mb), C(threads), C(allocators),
        C(layouts), C(parallel), C(min_gain_percent), C(prompt_tokens), C(output_tokens), C(concurrency),
        C(requests), C(max_ttft_p95_ms), C(max_tpot_p95_ms), C(budget_s), C(api_key_set), C(twin),
        C(twin_max_gap_percent), C(twin_max_rounds), C(settle_timeout), C(busy_limit), C(capacity)); see the autotune
        role's variables.
    type: dict
  topology:
    description: With O(action=start), the host's C(cpu_topology) facts.
    type: dict
  service_inputs:
    description: With O(action=start), the inference_service role's C(inference_service_inputs) (model and engines).
    type: dict
  service_argument_spec:
    description:
      - The options of the inference_service role's C(main) entry point (its C(meta/argument_specs.yml)); a chosen
        setting whose variables fail them is not stored or not reused.
    type: dict
  state:
    description: With O(action=next), O(action=record) and O(action=finish), the RV(state) the step before returned.
    type: dict
  measurement:
    description:
      - With O(action=record), either C(failure) (the message of a failed deploy or measurement) or C(result) (the
        inference_benchmark result), C(running) (C(inference_service_running)), C(twin) (the benchmark role's twin
        row), C(roofline) (the memory_bandwidth result), C(engine_pids), C(deploy) and C(deploy_s); and C(deployed),
        whether the row's deploy finished.
    type: dict
  host:
    description: Host name in the report's title.
    type: str
    default: ""
  cpu_model:
    description: CPU model in the report.
    type: str
    default: ""
  reason:
    description: With O(action=discard), why the stored result is set aside.
    type: str
    default: ""
notes:
  - Times are the host's clock; the state carries the sweep's start.
"""

EXAMPLES = r"""
- name: Start the sweep, or keep the stored result
  autotune_sweep:
    action: start
    config: "{{ __autotune_config }}"
    topology: "{{ cpu_topology }}"
    service_inputs: "{{ inference_service_inputs }}"
    service_argument_spec: "{{ (lookup('ansible.builtin.file', '../inference_service/meta/argument_specs.yml') | from_yaml).argument_specs.main.options }}"
  register: sweep

- name: Plan the next row
  autotune_sweep:
    action: next
    state: "{{ sweep.state }}"
  register: next_row
"""

RETURN = r"""
holds:
  description: With O(action=start), whether the stored result is kept.
  returned: action start
  type: bool
message:
  description: With O(action=start), why the stored result is kept or a sweep starts.
  returned: action start
  type: str
  sample: "autotune: measuring, changed since the stored result: workload"
changed_inputs:
  description: With O(action=start), the groups of inputs that differ from the stored result's.
  returned: action start
  type: list
  elements: str
state:
  description: The sweep's state, to pass to the next step.
  returned: actions start (when measuring), next and record
  type: dict
row:
  description:
    - With O(action=next), the row to measure (C(setting), C(stage), C(deploy) - C(main) or C(unit) -,
      C(twin_deadline), C(settle_timeout), C(retry)), or null when the sweep is done. With O(action=record), the
      row recorded, or null when the row is measured again.
  returned: actions next and record
  type: dict
result:
  description: The sweep's result (chosen, reason, reference, rows, steps, inputs, workload, ...), as stored.
  returned: actions start (when it holds) and finish
  type: dict
report:
  description: The sweep table as Markdown.
  returned: actions start (when it holds) and finish
  type: str
served_capacity:
  description:
    - The capacity stage's sweep of the served setting, as the benchmark role keeps a sweep of its own (C(engine),
      C(result), the sweep, and C(engine_batched), the engine's own batched figure), for the validation's report;
      an empty dict when the stage measured none.
  returned: actions start (when it holds) and finish
  type: dict
"""

import datetime
import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_autotune import (SweepError, changed_inputs, deploy_errors, inputs_of, new_state,
                                                   next_row, record, report_markdown, result_of, served_capacity,
                                                   sweep_config)
from ansible.module_utils.llmtune_cpuload import tree_kib
from ansible.module_utils.llmtune_state import write_atomic


def read_json(path):
    """The JSON document at PATH, or None when there is none; ValueError names a damaged one."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise ValueError(f"{path} is not JSON: {error}") from error


def baseline_summary(path):
    """The stored baseline's summary with the prompt length of its first level, or {}."""
    try:
        stored = read_json(path) or {}
    except ValueError:
        return {}
    summary = dict(stored.get("summary") or {})
    if summary:
        summary["prompt_tokens_mean"] = ((stored.get("levels") or [{}])[0]).get("prompt_tokens_mean")
    return summary


def peak_rss_kb(pids):
    """VmHWM (kB) of each PID, proc(5), summed over its process tree (an engine's child processes hold its model and
    KV cache: vLLM's worker); 0 for a process that is gone."""
    return [tree_kib(int(pid), "VmHWM") or 0 for pid in pids]


def start(params):
    config = sweep_config(params["config"], params["topology"])
    inputs = inputs_of(config, params["topology"], params["service_inputs"])
    stored = read_json(params["state_path"])
    changed = changed_inputs(inputs, stored) if stored else ["no stored result"]
    errors = deploy_errors(stored.get("chosen"), params["service_argument_spec"] or {}) if stored else []
    if stored and not changed and not errors and not params["remeasure"]:
        baseline = baseline_summary(params["baseline_path"])
        return {"holds": True, "result": stored, "changed_inputs": [], "served_capacity": served_capacity(stored),
                "report": report_markdown(stored, params["host"], params["cpu_model"], baseline),
                "message": (f"autotune: the stored result holds ({params['state_path']}, measured "
                            f"{stored.get('finished', '?')}; CPU, model, engines, allowed stacks and workload unchanged; "
                            "autotune_remeasure=true measures again)")}
    if params["remeasure"]:
        why = "autotune_remeasure"
    elif errors and not changed:
        why = "the stored choice would not deploy: " + "; ".join(errors)
    else:
        why = "changed since the stored result: " + ", ".join(changed) if stored else "no stored result"
    state = new_state(config, time.time())
    state["inputs"] = inputs
    return {"holds": False, "changed_inputs": changed, "state": state, "message": "autotune: measuring, " + why}


def finish(params, check_mode=False):
    """(out, failure): the result and report; the result stored unless FAILURE names why it cannot be."""
    state = params["state"]
    now = time.time()
    finished = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    result = result_of(state, now, finished, state.get("inputs") or {})
    report = report_markdown(result, params["host"], params["cpu_model"], baseline_summary(params["baseline_path"]))
    errors = deploy_errors(result["chosen"], params["service_argument_spec"] or {})
    if errors:
        statuses = ", ".join(row["status"] for row in result["rows"])
        why = ("no candidate was measured within the limits (" + statuses + ")" if not result["chosen"]
               else "the chosen setting would not deploy: " + "; ".join(errors))
        return {"result": result, "report": report}, f"autotune: {why}; nothing stored at {params['state_path']}"
    if not check_mode:
        os.makedirs(os.path.dirname(params["state_path"]) or ".", exist_ok=True)
        write_atomic(params["state_path"], json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return {"changed": True, "result": result, "report": report, "served_capacity": served_capacity(result)}, None


def discard(params, check_mode=False):
    """Rename the stored result to <path>.failed with the reason; {"changed": whether there was one}."""
    path = params["state_path"]
    if not os.path.exists(path):
        return {"changed": False}
    if not check_mode:
        try:
            stored = read_json(path) or {}
        except ValueError as error:
            stored = {"unreadable": str(error)}
        stored["discarded"] = {"reason": params["reason"],
                               "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        write_atomic(path + ".failed", json.dumps(stored, indent=2, ensure_ascii=False) + "\n")
        os.unlink(path)
    return {"changed": True}


REQUIRED = {"start": ("config", "topology", "service_inputs"), "next": ("state",), "record": ("state", "measurement"),
            "finish": ("state",), "discard": ()}

ARGUMENT_SPEC = {
    "action": {"type": "str", "required": True, "choices": list(REQUIRED)},
    "state_path": {"type": "path", "default": "/var/lib/llmtune/autotune.json"},
    "baseline_path": {"type": "path", "default": "/var/lib/llmtune/baseline.json"},
    "remeasure": {"type": "bool", "default": False},
    "config": {"type": "dict"},
    "topology": {"type": "dict"},
    "service_inputs": {"type": "dict"},
    "service_argument_spec": {"type": "dict"},
    "state": {"type": "dict"},
    "measurement": {"type": "dict"},
    "host": {"type": "str", "default": ""},
    "cpu_model": {"type": "str", "default": ""},
    "reason": {"type": "str", "default": ""},
}


def main():
    """Run one step; only finish and discard write (C(changed)); check mode writes nothing."""
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    missing = [name for name in REQUIRED[params["action"]] if params[name] is None]
    if missing:
        module.fail_json(msg=f"action={params['action']} needs {', '.join(missing)}")
    try:
        if params["action"] == "start":
            module.exit_json(changed=False, **start(params))
        if params["action"] == "next":
            state = params["state"]
            row = next_row(state, time.time())
            module.exit_json(changed=False, row=row, state=state)
        if params["action"] == "record":
            state, measurement = params["state"], dict(params["measurement"])
            if not measurement.get("failure"):
                measurement["rss_kb"] = peak_rss_kb(measurement.get("engine_pids") or [])
            row = record(state, measurement)
            module.exit_json(changed=False, row=row, state=state)
        if params["action"] == "finish":
            out, failure = finish(params, module.check_mode)
            if failure:
                module.fail_json(msg=failure, **out)
            module.exit_json(**out)
        module.exit_json(**discard(params, module.check_mode))
    except (SweepError, ValueError, KeyError, OSError) as error:
        module.fail_json(msg=f"autotune_sweep {params['action']}: {type(error).__name__}: {error}")


if __name__ == "__main__":
    main()
