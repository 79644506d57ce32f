#!/usr/bin/env python3
"""A host's capacity at the targets: its table (Markdown) and latency against throughput (PNG), on the controller.

Usage: capacity_report.py HOST.json TABLE.md CHART.png (HOST.json as the benchmark role writes it, with its
"capacity": the sweep's result, the engine's own batched figure and the engine's name). The table and its words
are module_utils/llmtune_capacity.py's report_markdown.
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display on the controller
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "module_utils"))
from llmtune_capacity import report_markdown  # noqa: E402


def draw(host, result, engine, target):
    """TTFT p95 and ITL p95 against aggregate output tokens/s, a point per level labelled with its streams, the
    targets as lines and the capacity ringed; beside them output tokens/s, goodput and the engine's own figure per
    streams. Writes TARGET."""
    levels, cap = result["levels"], result["capacity"]
    throughput = [level["output_tokens_per_s"] for level in levels]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for axis, key, label, limit in ((axes[0], "ttft_ms", "TTFT p95, ms", cap["targets"]["ttft_p95_ms"]),
                                    (axes[1], "itl_ms", "ITL p95, ms", cap["targets"]["itl_p95_ms"])):
        values = [level[key]["p95"] for level in levels]
        axis.plot(throughput, values, "o-", color="tab:blue")
        for level, x, y in zip(levels, throughput, values):
            axis.annotate(str(level["concurrency"]), (x, y), textcoords="offset points", xytext=(4, 4))
        axis.axhline(limit, color="tab:red", linestyle="--", label=f"target {limit:g} ms")
        best = [(x, y) for level, x, y in zip(levels, throughput, values) if level["concurrency"] == cap["concurrency"]]
        if best:
            axis.plot(*best[0], "o", markersize=16, markerfacecolor="none", markeredgecolor="tab:green",
                      markeredgewidth=2, label=f"capacity: {cap['concurrency']} streams")
        axis.set_xlabel("aggregate output tokens/s")
        axis.set_ylabel(label)
        axis.legend()
    streams = [level["concurrency"] for level in levels]
    rates = axes[2]
    rates.plot(streams, throughput, "o-", label="service, output tokens/s")
    rates.plot(streams, [level.get("goodput_tokens_per_s") for level in levels], "s--", label="goodput")
    own = {entry["concurrency"]: entry["engine_tokens_per_s"] for entry in (engine or {}).get("comparison", [])}
    if any(value is not None for value in own.values()):
        rates.plot(streams, [own.get(count) for count in streams], "^:", label="llama-batched-bench, same engine")
    rates.set_xscale("log", base=2)
    rates.set_xticks(streams, [str(count) for count in streams])
    rates.set_xlabel("concurrent streams")
    rates.set_ylabel("tokens/s")
    rates.legend()
    fig.suptitle(f"{host}: capacity {cap['concurrency']} streams within TTFT p95 {cap['targets']['ttft_p95_ms']:g} ms "
                 f"and ITL p95 {cap['targets']['itl_p95_ms']:g} ms")
    fig.tight_layout()
    fig.savefig(target, dpi=100)
    plt.close(fig)


def main(source, table, chart):
    """Write TABLE and CHART from the host report SOURCE."""
    with open(source, encoding="utf-8") as handle:
        report = json.load(handle)
    capacity = report["capacity"]
    lines = report_markdown(report["host"], capacity["result"], capacity.get("engine_batched"), capacity["engine"])
    lines += ["", f"![latency against throughput]({os.path.basename(chart)})", ""]
    with open(table, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))
    draw(report["host"], capacity["result"], capacity.get("engine_batched"), chart)


if __name__ == "__main__":
    main(*sys.argv[1:4])
