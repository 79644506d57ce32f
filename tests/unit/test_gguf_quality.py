"""The quality gate: llama-perplexity's KL-divergence figures as library/gguf_quality.py reads them, the gate's verdict
(module_utils/llmtune_quality.py) with the autotune role's default bounds, and a real run of a cached llama.cpp build
that passes q8_0 and refuses q2_k, a format really damaged."""

import os
import subprocess

import pytest
import yaml
from conftest import FIXTURES, ROOT, convert_to_gguf, llama_cpp_build, needs_llama_cpp

import gguf_quality  # noqa: E402  (library/ is on sys.path via conftest)
from ansible.module_utils import llmtune_quality as quality

SPEC = yaml.safe_load(open(os.path.join(ROOT, "roles", "autotune", "meta", "argument_specs.yml"), encoding="utf-8"))
OPTIONS = SPEC["argument_specs"]["main"]["options"]
# The role's default bounds, by the gate's names.
BOUNDS = {name: OPTIONS[f"autotune_quality_{name}"]["default"] for name in quality.BOUNDS}


def captured(fmt):
    with open(os.path.join(FIXTURES, "quality", f"qwen3-0.6b-proxy-{fmt}.log"), encoding="utf-8") as handle:
        return handle.read()


def test_the_figures_of_a_captured_run():
    assert quality.parse_kl_divergence(captured("q8_0")) == {
        "kld_mean": 0.000202, "kld_p99": 0.00026, "kld_max": 0.000265, "same_top_percent": 92.913,
        "ppl_ratio": 1.001579, "ppl": 180088.586314, "ppl_base": 179804.736172, "chunks": 4, "context_tokens": 256,
        "scored_tokens": 508}


@pytest.mark.parametrize("fmt, reasons", [
    ("q8_0", []),
    # Opted-in 4-bit on random weights: the same top token is a coin toss between near-equal logits.
    ("q4_0", ["same top token 46.063 % < 85 %"]),
    ("q2_k", ["mean KLD 0.112679 > 0.05", "same top token 13.386 % < 85 %"]),
])
def test_the_default_bounds_pass_q8_0_and_refuse_q2_k(fmt, reasons):
    assert quality.verdict(quality.parse_kl_divergence(captured(fmt)), BOUNDS) == reasons


def test_a_bound_of_zero_is_no_bound():
    figures = quality.parse_kl_divergence(captured("q2_k"))
    assert quality.verdict(figures, dict(BOUNDS, max_kld_mean=0, min_same_top_percent=0)) == []


def test_output_without_the_figures_is_named():
    with pytest.raises(quality.QualityError, match="no kld mean"):
        quality.parse_kl_divergence("Final estimate: PPL = 12.3 +/- 0.4\n")


# --- a real run: llama-quantize and llama-perplexity of one build from the cache ---

@needs_llama_cpp
def test_a_real_gate_passes_q8_0_and_refuses_q2_k(proxy_model_dir, tmp_path):
    tools = llama_cpp_build()[0]
    bf16 = convert_to_gguf(proxy_model_dir, tmp_path / "proxy-bf16.gguf")
    figures = {}
    for fmt in ("q8_0", "q2_k"):
        out = tmp_path / f"proxy-{fmt}.gguf"
        subprocess.run([os.path.join(tools, "llama-quantize"), str(bf16), str(out), fmt.upper()], check=True,
                       capture_output=True)
        params = dict(tools=tools, model=str(out), base=str(bf16), text=None, context_tokens=256, chunks=4, threads=0,
                      base_logits=None, dest=None, timeout=600)
        figures[fmt], measured = gguf_quality.measure(params)
        assert measured
        # The same inputs again: the stored figures, nothing run.
        assert gguf_quality.measure(params) == (figures[fmt], False)
    assert quality.verdict(figures["q8_0"], BOUNDS) == []
    assert "mean KLD" in " ".join(quality.verdict(figures["q2_k"], BOUNDS))
    assert figures["q8_0"]["kld_mean"] * 20 < figures["q2_k"]["kld_mean"]
    assert figures["q8_0"]["inputs"]["text"].endswith("LICENSE.txt")
