#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: the host's llmtune files as Prometheus metrics, written atomically for the node exporter."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llmtune_metrics
short_description: Export the host's tuning state, last validation and chosen stack as Prometheus metrics
description:
  - Reads the host's llmtune files - the state file (each setting changed), the untuned baseline, the last passed
    validation (TTFT, TPOT, ITL, end-to-end and decode figures, the gain over the baseline, the roofline, the gap to
    the direct-run twin), the auto-tune's stored choice (the chosen stack) and the last drift check - and writes them
    to O(path) in Prometheus' text exposition format, for the node exporter's textfile collector (which reads every
    C(*.prom) file of its C(--collector.textfile.directory) at each scrape).
  - Every metric is named C(llmtune_*), with the base unit in its name (C(_seconds), C(_tokens_per_second), C(_ratio)
    for a ratio where 1.0 is 100 %, C(_timestamp_seconds) for a Unix time) and host-independent facts as labels
    (C(run), C(figure), C(setting), C(status), C(engine), C(format), C(layout), C(allocator)).
    C(llmtune_source_present{source}) tells which files were found; a missing file gives none of its metrics.
  - The file is replaced atomically and durably (a temporary file in the same folder, which the collector ignores,
    fsynced and renamed over it, then the folder fsynced), so a scrape never reads half a file. Unchanged text is
    not written again.
  - With O(drift_rows), first stores them with the time of the check in O(drift_path) (the drift metrics of every
    later call come from there); with O(forget_drift), removes O(drift_path) (after a run that applied the tuning
    again, the last check no longer describes the host).
  - Supports check mode (writes nothing, reports what would change) and diff (the metrics text before and after).
options:
  path:
    description: The metrics file; its folder must exist (the node exporter's textfile folder). Mode 0644.
    type: path
    default: /var/lib/prometheus/node-exporter/llmtune.prom
  state_path:
    description: The llmtune state file (settings, files and packages recorded before their first change).
    type: path
    default: /var/lib/llmtune/state.json
  baseline_path:
    description: The untuned baseline (a result of the C(inference_benchmark) module).
    type: path
    default: /var/lib/llmtune/baseline.json
  validation_path:
    description: The last passed validation as the benchmark role stores it (C(result), C(twin), C(validated)).
    type: path
    default: /var/lib/llmtune/validation.json
  autotune_path:
    description: The auto-tune's stored result, whose C(chosen) setting is the stack served; empty exports no stack
      (a service pinned by variables, C(llmtune_autotune=false)).
    type: str
    default: /var/lib/llmtune/autotune.json
  drift_path:
    description: The last drift check (JSON, C(checked) and C(rows)), read for the drift metrics.
    type: path
    default: /var/lib/llmtune/drift.json
  drift_rows:
    description: Rows of a drift check just made (RV(tuning_drift#module:rows) of the C(tuning_drift) module), stored
      in O(drift_path) with the time.
    type: list
    elements: dict
  forget_drift:
    description: Remove O(drift_path) before exporting.
    type: bool
    default: false
notes:
  - A source file that is not a JSON object fails the task, naming it; nothing is written then.
seealso:
  - name: Prometheus metric and label naming
    link: https://prometheus.io/docs/practices/naming/
  - name: Text-based exposition format
    link: https://prometheus.io/docs/instrumenting/exposition_formats/
author: llmtune contributors
"""

EXAMPLES = r"""
- name: Export the tuning state, the last validation and the chosen stack
  llmtune_metrics:
    path: /var/lib/prometheus/node-exporter/llmtune.prom
    forget_drift: true

- name: Export a drift check just made
  llmtune_metrics:
    drift_rows: "{{ verify_drift.rows }}"
"""

RETURN = r"""
path:
  description: O(path).
  returned: always
  type: str
  sample: /var/lib/prometheus/node-exporter/llmtune.prom
metrics:
  description: The names of the metric families written.
  returned: always
  type: list
  elements: str
  sample: [llmtune_source_present, llmtune_state_settings, llmtune_benchmark_decode_tokens_per_second]
text:
  description: The metrics text (exposition format 0.0.4).
  returned: always
  type: str
"""

import datetime
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.llmtune_metrics import collect, render
from ansible.module_utils.llmtune_state import write_atomic


def read_json(path):
    """The JSON object stored at PATH (str), or None when there is no such file (or PATH is empty). Raises ValueError
    naming the file when it is not a JSON object."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise ValueError("%s is not JSON: %s" % (path, exc))
    if not isinstance(data, dict):
        raise ValueError("%s is not a JSON object" % path)
    return data


def read_text(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/var/lib/prometheus/node-exporter/llmtune.prom"},
            "state_path": {"type": "path", "default": "/var/lib/llmtune/state.json"},
            "baseline_path": {"type": "path", "default": "/var/lib/llmtune/baseline.json"},
            "validation_path": {"type": "path", "default": "/var/lib/llmtune/validation.json"},
            "autotune_path": {"type": "str", "default": "/var/lib/llmtune/autotune.json"},
            "drift_path": {"type": "path", "default": "/var/lib/llmtune/drift.json"},
            "drift_rows": {"type": "list", "elements": "dict"},
            "forget_drift": {"type": "bool", "default": False},
        },
        mutually_exclusive=[("drift_rows", "forget_drift")],
        supports_check_mode=True,
    )
    params = module.params
    folder = os.path.dirname(params["path"])
    if not os.path.isdir(folder):
        module.fail_json(msg="llmtune_metrics: the folder of %s does not exist (no node exporter textfile folder here)"
                         % params["path"])
    changed = False
    try:
        drift = read_json(params["drift_path"])
        if params["forget_drift"] and drift is not None:
            changed = True
            drift = None
            if not module.check_mode:
                os.unlink(params["drift_path"])
        if params["drift_rows"] is not None:
            checked = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            drift = {"checked": checked.replace("+00:00", "Z"), "rows": params["drift_rows"]}
            changed = True
            if not module.check_mode:
                os.makedirs(os.path.dirname(params["drift_path"]) or ".", mode=0o755, exist_ok=True)
                write_atomic(params["drift_path"], json.dumps(drift, indent=2, sort_keys=True) + "\n", mode=0o644)
        sources = {"state": read_json(params["state_path"]), "baseline": read_json(params["baseline_path"]),
                   "validation": read_json(params["validation_path"]),
                   "autotune": read_json(params["autotune_path"]), "drift": drift}
        families = collect(sources)
        text = render(families)
        before = read_text(params["path"])
        if text != before:
            changed = True
            if not module.check_mode:
                write_atomic(params["path"], text, mode=0o644)
    except (OSError, ValueError) as exc:
        module.fail_json(msg="llmtune_metrics: %s" % exc)
    module.exit_json(changed=changed, path=params["path"], metrics=[family.name for family in families], text=text,
                     diff={"before": before, "after": text, "before_header": params["path"],
                           "after_header": params["path"]})


if __name__ == "__main__":
    main()
