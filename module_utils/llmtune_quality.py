# -*- coding: utf-8 -*-
"""The quality of a quantized GGUF against its bf16 source, as llama.cpp's llama-perplexity measures it: the figures
read from its output, and the quality gate's verdict on them (library/gguf_quality.py measures; the auto-tune,
module_utils/llmtune_autotune.py, refuses a format whose figures break the operator's bounds).

The figures are those of llama-perplexity --kl-divergence (tools/perplexity/README.md): the mean and 99th
percentile of the per-token Kullback-Leibler divergence of the quantized model's next-token distribution from the
base model's, how often both rank the same token first, and the ratio of their perplexities.
"""

from __future__ import annotations

import re

# Formats whose weights are the model's own numbers (converted, not quantized): no gate.
UNQUANTIZED = ("f32", "f16", "bf16")
# The operator's bounds, by the figure each bounds: (figure, "max" or "min", its name in a reason, its unit).
BOUNDS = {"max_kld_mean": ("kld_mean", "max", "mean KLD", ""), "max_kld_p99": ("kld_p99", "max", "99 % KLD", ""),
          "min_same_top_percent": ("same_top_percent", "min", "same top token", " %"),
          "max_ppl_ratio": ("ppl_ratio", "max", "PPL ratio", "")}
_NUMBER = r"(-?[0-9.]+(?:[eE][-+]?[0-9]+)?)"
_FIGURES = {
    "kld_mean": rf"^Mean\s+KLD:\s+{_NUMBER}",
    "kld_p99": rf"^99\.0%\s+KLD:\s+{_NUMBER}",
    "kld_max": rf"^Maximum KLD:\s+{_NUMBER}",
    "same_top_percent": rf"^Same top p:\s+{_NUMBER}",
    "ppl_ratio": rf"^Mean PPL\(Q\)/PPL\(base\)\s+:\s+{_NUMBER}",
    "ppl": rf"^Mean PPL\(Q\)\s+:\s+{_NUMBER}",
    "ppl_base": rf"^Mean PPL\(base\)\s+:\s+{_NUMBER}",
}
_CHUNKS = r"kl_divergence: computing over ([0-9]+) chunks, n_ctx=([0-9]+)"


class QualityError(Exception):
    """Output of llama-perplexity without the figures of a KL-divergence run."""


def parse_kl_divergence(text):
    """The figures of llama-perplexity --kl-divergence output TEXT (its log, timestamps and levels included), with
    the chunks and context it ran; QualityError naming what is missing."""
    out = {}
    for name, pattern in _FIGURES.items():
        found = [float(match) for match in re.findall(pattern, _strip_log_prefixes(text), re.MULTILINE)]
        if not found:
            raise QualityError(f"llama-perplexity printed no {name.replace('_', ' ')} (is this a --kl-divergence run?)")
        out[name] = found[-1]
    chunks = re.findall(_CHUNKS, text)
    if chunks:
        out["chunks"], out["context_tokens"] = (int(value) for value in chunks[-1])
        # llama-perplexity scores the second half of each chunk.
        out["scored_tokens"] = out["chunks"] * (out["context_tokens"] - 1 - out["context_tokens"] // 2)
    return out


def _strip_log_prefixes(text):
    # llama.cpp's log lines may start with "0.02.207.148 I " (time and level) before the message.
    return re.sub(r"^[0-9.]+ [A-Z] ", "", text, flags=re.MULTILINE)


def verdict(figures, bounds):
    """Why FIGURES (parse_kl_divergence's) break BOUNDS (BOUNDS' names to numbers; 0 or None: not bounded), one
    reason per broken bound; [] when the format passes the gate."""
    reasons = []
    for name, (figure, kind, label, unit) in BOUNDS.items():
        limit = (bounds or {}).get(name)
        if not limit or figure not in figures:
            continue
        value = figures[figure]
        if (kind == "max" and value > limit) or (kind == "min" and value < limit):
            reasons.append(f"{label} {value}{unit} {'>' if kind == 'max' else '<'} {limit:g}{unit}")
    return reasons


def summary(figures):
    """One cell of the report: mean KLD / 99 % KLD / same top % / PPL ratio."""
    if not figures:
        return "-"
    return (f"{figures['kld_mean']} / {figures['kld_p99']} / {figures['same_top_percent']} % / "
            f"{figures['ppl_ratio']}")
