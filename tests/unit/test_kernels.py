"""The rule table (module_utils/llmtune_kernels.py) on the /proc/cpuinfo of each CPU shape (tests/fixtures/cpuinfo),
read by cpu_topology's own parser: the formats each engine measures first."""

import os
import signal

import pytest

import cpu_topology  # noqa: E402  (library/ is on sys.path via conftest)
import llama_cpp_probe  # noqa: E402
from conftest import FIXTURES, llama_cpp_build, needs_llama_cpp

from ansible.module_utils import llmtune_kernels as kernels

LLAMA_TYPES = ["bf16", "q8_0", "q4_k_m", "q4_0", "f16"]


def isa_of(name):
    return cpu_topology.read_cpuinfo(os.path.join(FIXTURES, "cpuinfo", name), live=False)["isa"]


@pytest.mark.parametrize("cpu, shape, llama_cpp, torch", [
    # AMX: the quantized types on AMX int8 tiles, bf16 on AVX-512 bf16; torch's bf16 in oneDNN's AMX kernels.
    ("xeon-emerald-rapids-kvm", "amx", ["q4_0", "q4_k_m", "q8_0", "bf16", "f16"], ["bfloat16", "float32"]),
    # AVX-512 with bf16: the int8 dot products of q8_0 before bf16 (half the bytes a weight).
    ("epyc-zen4-kvm", "avx512_bf16", ["q4_0", "q4_k_m", "q8_0", "bf16", "f16"], ["bfloat16", "float32"]),
    ("epyc-zen5-kvm", "avx512_bf16", ["q4_0", "q4_k_m", "q8_0", "bf16", "f16"], ["bfloat16", "float32"]),
    # AVX2 only: 4-bit repacked blocks, q8_0; bf16 has no arithmetic here (widened in software), so torch's float32 first.
    ("epyc-zen3-kvm", "avx2", ["q4_0", "q4_k_m", "q8_0", "bf16", "f16"], ["float32", "bfloat16"]),
    ("xeon-broadwell-avx2", "avx2", ["q4_0", "q4_k_m", "q8_0", "bf16", "f16"], ["float32", "bfloat16"]),
    ("arm-graviton3", "arm_i8mm", ["q4_0", "q4_k_m", "q8_0", "bf16", "f16"], ["bfloat16", "float32"]),
])
def test_each_cpu_shape_orders_the_formats_its_units_favour(cpu, shape, llama_cpp, torch):
    isa = isa_of(cpu)
    assert kernels.shape(isa) == shape
    assert kernels.order("llama_cpp", LLAMA_TYPES, isa) == llama_cpp
    assert kernels.order("transformers", ["bfloat16", "float32"], isa) == torch
    assert kernels.order("vllm", ["bfloat16", "float32"], isa) == torch


def test_the_operators_formats_alone_in_the_table_order():
    isa = isa_of("epyc-zen3-kvm")
    assert kernels.order("llama_cpp", ["bf16", "q8_0"], isa) == ["q8_0", "bf16"]
    assert kernels.order("llama_cpp", ["f32", "bf16"], isa) == ["f32", "bf16"]
    assert kernels.kernel("llama_cpp", "q4_0", isa) == "AVX2 8x8 repacked blocks"
    assert kernels.kernel("llama_cpp", "bf16", isa) == ""
    assert kernels.kernel("transformers", "bfloat16", isa_of("xeon-emerald-rapids-kvm")) == "oneDNN AMX bf16"


def test_a_cpu_without_known_extensions_keeps_the_operators_order():
    assert kernels.shape({}) == "other"
    assert kernels.order("llama_cpp", ["bf16", "q8_0"], {}) == ["bf16", "q8_0"]


# --- the kernels llama.cpp reports it ran (llama-bench -v, tests/fixtures/llama-bench) ---

def bench_output(fmt):
    with open(os.path.join(FIXTURES, "llama-bench", f"qwen3-0.6b-proxy-{fmt}-haswell.log"), encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.parametrize("fmt, summary", [
    # On AVX2 q4_0's weight matrices are repacked to 8x8 blocks; the embedding (q6_K) and norms stay as stored.
    ("q4_0", "ggml-cpu-haswell, q4_0_8x8 x130, CPU_REPACK 236.25 MiB"),
    ("q8_0", "ggml-cpu-haswell, weights as stored"),
    ("bf16", "ggml-cpu-haswell, weights as stored"),
])
def test_the_kernel_path_llama_bench_reports(fmt, summary):
    path = kernels.parse_llama_bench(bench_output(fmt))
    assert path["variant"] == "haswell"
    assert kernels.llama_cpp_summary(path) == summary


def test_a_variant_that_dies_with_sigill_is_set_aside_and_the_next_one_runs(tmp_path, monkeypatch):
    """The fault of an AMX Xeon VM (the sapphirerapids variant's int8 kernel died with SIGILL): the probe moves the
    variant that ggml loaded and runs again. The runs are llama-bench's recorded output; the files are real."""
    for name in ("llama-bench", "libggml-cpu-sapphirerapids.so", "libggml-cpu-zen4.so"):
        (tmp_path / name).write_text("")
    (tmp_path / "llama-bench").chmod(0o755)
    died = "load_backend: loaded CPU backend from /x/libggml-cpu-sapphirerapids.so\n"
    ran = bench_output("q8_0").replace("haswell", "zen4")
    runs = iter([(-signal.SIGILL, died), (0, ran)])
    monkeypatch.setattr(llama_cpp_probe, "run_bench", lambda params: next(runs))
    kernel, disabled = llama_cpp_probe.probe({"programs": str(tmp_path), "model": "m.gguf", "threads": 2,
                                              "timeout": 60})
    assert disabled == ["sapphirerapids"]
    assert (tmp_path / "disabled" / "libggml-cpu-sapphirerapids.so").exists()
    assert not (tmp_path / "libggml-cpu-sapphirerapids.so").exists()
    assert kernel["summary"] == "ggml-cpu-zen4, weights as stored"


@needs_llama_cpp
def test_a_real_probe_of_a_cached_build(tiny_gguf):
    kernel, disabled = llama_cpp_probe.probe({"programs": llama_cpp_build()[0], "model": tiny_gguf, "threads": 1,
                                              "timeout": 120})
    assert disabled == []
    assert kernel["variant"] and kernel["summary"].startswith(f"ggml-cpu-{kernel['variant']}")
