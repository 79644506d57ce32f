#!/usr/bin/env python3
"""A host's capacity at the targets: its table (Markdown) and latency against throughput (PNG), on the controller.

Usage: capacity_report.py HOST.json TABLE.md CHART.png (HOST.json as the benchmark role writes it, with its
"capacity": the sweep's result, the engine's own batched figure and the engine's name). The table and its words
are module_utils/llmtune_capacity.py's report_markdown.
       capacity_report.py --autotune HOST-autotune.json CHART.png: the chart of every engine the auto-tune's capacity
stage swept, on the same axes (its tables are in the auto-tune's report).
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display on the controller
import matplotlib.pyplot as plt  # noqa: E402

import ansible.module_utils  # noqa: E402  (run by ansible-playbook's Python)

# The project's module_utils/ under the namespace Ansible serves it in, as for a module.
ansible.module_utils.__path__.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                                  "module_utils"))
from ansible.module_utils.llmtune_capacity import report_markdown  # noqa: E402


def draw(host, sweeps, target):
    """TTFT p95 and ITL p95 against aggregate output tokens/s, a line per sweep (SWEEPS: [(name, result, engine's
    own batched figure)], one per engine the auto-tune swept) with a point per level labelled with its streams, the
    targets as lines and each capacity ringed; beside them output tokens/s, goodput and the engine's own figure per
    streams. Writes TARGET."""
    targets = sweeps[0][1]["capacity"]["targets"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for index, (name, result, engine) in enumerate(sweeps):
        levels, cap = result["levels"], result["capacity"]
        color, prefix = f"C{index}", f"{name}: " if name else ""
        throughput = [level["output_tokens_per_s"] for level in levels]
        for axis, key in ((axes[0], "ttft_ms"), (axes[1], "itl_ms")):
            values = [level[key]["p95"] for level in levels]
            axis.plot(throughput, values, "o-", color=color, label=name or None)
            for level, x, y in zip(levels, throughput, values):
                axis.annotate(str(level["concurrency"]), (x, y), textcoords="offset points", xytext=(4, 4))
            best = [(x, y) for level, x, y in zip(levels, throughput, values)
                    if level["concurrency"] == cap["concurrency"]]
            if best:
                axis.plot(*best[0], "o", markersize=16, markerfacecolor="none", markeredgecolor=color,
                          markeredgewidth=2, label=f"{prefix}capacity {cap['concurrency']} streams")
        streams = [level["concurrency"] for level in levels]
        axes[2].plot(streams, throughput, "o-", color=color, label=f"{prefix}service, output tokens/s")
        axes[2].plot(streams, [level.get("goodput_tokens_per_s") for level in levels], "s--", color=color,
                     label=f"{prefix}goodput")
        own = {entry["concurrency"]: entry["engine_tokens_per_s"] for entry in (engine or {}).get("comparison", [])}
        if any(value is not None for value in own.values()):
            axes[2].plot(streams, [own.get(count) for count in streams], "^:", color=color,
                         label=f"{prefix}{engine.get('tool', 'llama-batched-bench')}, same engine")
    for axis, label, limit in ((axes[0], "TTFT p95, ms", targets["ttft_p95_ms"]),
                               (axes[1], "ITL p95, ms", targets["itl_p95_ms"])):
        axis.axhline(limit, color="tab:red", linestyle="--", label=f"target {limit:g} ms")
        axis.set_xlabel("aggregate output tokens/s")
        axis.set_ylabel(label)
        axis.legend(fontsize="small")
    every = sorted({level["concurrency"] for _, result, _ in sweeps for level in result["levels"]})
    axes[2].set_xscale("log", base=2)
    axes[2].set_xticks(every, [str(count) for count in every])
    axes[2].set_xlabel("concurrent streams")
    axes[2].set_ylabel("tokens/s")
    axes[2].legend(fontsize="small")
    found = ", ".join(f"{prefix}{result['capacity']['concurrency']}" for prefix, result in
                      ((f"{name} " if name else "", result) for name, result, _ in sweeps))
    fig.suptitle(f"{host}: capacity {found} streams within TTFT p95 {targets['ttft_p95_ms']:g} ms "
                 f"and ITL p95 {targets['itl_p95_ms']:g} ms")
    fig.tight_layout()
    fig.savefig(target, dpi=100)
    plt.close(fig)


def draw_autotune(source, chart):
    """CHART of each sweep of the auto-tune's capacity stage in its stored result SOURCE (nothing without one)."""
    with open(source, encoding="utf-8") as handle:
        result = json.load(handle)
    records = [record for record in result.get("capacities") or [] if record.get("status") == "measured"]
    if records:
        draw(result.get("host", ""), [(f"{record['engine']} {(record.get('of') or {}).get('format') or ''}".strip(),
                                        record["sweep"], record.get("engine_batched")) for record in records], chart)


def main(source, table, chart):
    """Write TABLE and CHART from the host report SOURCE."""
    with open(source, encoding="utf-8") as handle:
        report = json.load(handle)
    capacity = report["capacity"]
    lines = report_markdown(report["host"], capacity["result"], capacity.get("engine_batched"), capacity["engine"])
    lines += ["", f"![latency against throughput]({os.path.basename(chart)})", ""]
    with open(table, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))
    draw(report["host"], [("", capacity["result"], capacity.get("engine_batched"))], chart)


if __name__ == "__main__":
    if sys.argv[1] == "--autotune":
        draw_autotune(*sys.argv[2:4])
    else:
        main(*sys.argv[1:4])
