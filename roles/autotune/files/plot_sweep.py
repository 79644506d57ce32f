#!/usr/bin/env python3
"""Bar chart of an auto-tune sweep: workload score and decode tokens/s per setting.

Usage: plot_sweep.py SWEEP.json CHART.png (SWEEP.json as written by the autotune role).
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display on the controller
import matplotlib.pyplot as plt  # noqa: E402


def main(source, target):
    """Draw the measured rows of SOURCE (the autotune JSON) into TARGET; the chosen bar is highlighted."""
    with open(source, encoding="utf-8") as handle:
        result = json.load(handle)
    chosen = result.get("chosen") or {}
    rows = [row for row in result["rows"] if row["status"] == "measured"]
    labels = [f"{row['engine']} {row['format']} {row['threads']}t"
              + (f" {row['allocator']}" if row["allocator"] != "none" else "")
              + (f" {row['parallel']}sl" if row.get("parallel") else "")
              + (" cb" if row.get("continuous_batching") else "")
              + (" per node" if row.get("layout") == "per_node" else "") if row["tuned"] else "defaults"
              for row in rows]
    keys = ("engine", "format", "threads", "cpus", "allocator", "parallel", "continuous_batching")
    # Rows stored before the layout was measured ran one engine.
    is_chosen = [all(row.get(key) == chosen.get(key) for key in keys)
                 and row.get("layout", "single") == chosen.get("layout", "single") for row in rows]
    colors = ["tab:green" if flag else ("tab:gray" if not row["tuned"] else "tab:blue")
              for row, flag in zip(rows, is_chosen)]
    fig, (score, decode) = plt.subplots(1, 2, figsize=(11, 4))
    score.bar(labels, [row["score_ms"] for row in rows], color=colors)
    score.set_ylabel("workload score, ms (lower is better)")
    decode.bar(labels, [row["decode_tokens_per_s"] for row in rows], color=colors)
    decode.plot(labels, [row["roofline_tokens_per_s"] for row in rows], "r_", markersize=30, label="roofline")
    decode.set_ylabel("decode tokens/s (higher is better)")
    decode.legend()
    for axis in (score, decode):
        axis.tick_params(axis="x", rotation=30)
    fig.suptitle(f"{result['host']}: {result['workload']['prompt_tokens']}-token prompt, "
                 f"{result['workload']['output_tokens']} output tokens (green = chosen)")
    fig.tight_layout()
    fig.savefig(target, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
