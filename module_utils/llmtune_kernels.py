# -*- coding: utf-8 -*-
"""Which weight formats each engine runs on its fastest kernels on a CPU, from the CPU's instruction-set extensions:
the rule table the auto-tune orders its candidate stacks by (module_utils/llmtune_autotune.py), so that each engine's
first row is the stack the CPU's matrix and vector units favour and a short time budget reaches it first.

The ISA is the cpu_topology module's (keys of library/cpu_topology.py X86_ISA and ARM_ISA). Decode of a small model
reads every weight once per token, so among the formats an engine has fast kernels for here, fewer bytes per weight
come first; the table names the kernel each format runs on, for the report.
"""

from __future__ import annotations

import re

from ansible.module_utils.llmtune_engines import ENGINES

# CPU shapes, the first whose extensions the CPU has: (name, extensions needed, what it computes fast).
SHAPES = (
    ("amx", ("amx_tile", "amx_int8", "amx_bf16"), "AMX tiles: int8 and bf16 matrix products"),
    ("avx512_bf16", ("avx512f", "avx512_bf16"), "AVX-512 with bf16 dot products"),
    ("avx512", ("avx512f",), "AVX-512 without bf16 arithmetic"),
    ("avx2", ("avx2",), "AVX2: 256-bit vectors, no bf16 arithmetic"),
    ("arm_i8mm", ("asimd", "i8mm"), "Arm NEON with int8 matrix multiply"),
    ("arm", ("asimd",), "Arm NEON"),
    ("other", (), "no vector extension the engines have kernels for"),
)
# Bytes per weight of each GGUF type (ggml block sizes), for the order among the fast ones.
GGUF_BITS = {"f32": 32, "f16": 16, "bf16": 16, "q8_0": 8.5, "q6_k": 6.56, "q5_k_m": 5.5, "q4_k_m": 4.85,
             "q4_0": 4.5}

# llama.cpp: the GGUF types with a fast kernel on each shape, and the kernel (ggml-cpu's, llama-cpp-python 0.3.36).
# AMX: ggml-cpu/amx (qtype_has_amx_kernels) for the quantized types; bf16 on AVX-512 BF16 dot products.
# AVX-512 and AVX2: q8_0 on the int8 dot products of the vector unit; q4_0 and q4_k repacked to 8x8 blocks
# (ggml-cpu/repack.cpp, ggml_cpu_has_avx2); bf16 only where the CPU has bf16 arithmetic.
LLAMA_CPP = {
    "amx": {"q8_0": "AMX int8 tiles", "q4_0": "AMX int8 tiles", "q4_k_m": "AMX int8 tiles (q4_K, q6_K)",
            "q6_k": "AMX int8 tiles", "q5_k_m": "AMX int8 tiles (q5_K, q6_K)", "bf16": "AVX-512 bf16 dot products"},
    "avx512_bf16": {"q8_0": "AVX-512 VNNI int8 dot products", "q4_0": "AVX2 8x8 repacked blocks",
                    "q4_k_m": "AVX2 8x8 repacked blocks (q4_K)", "bf16": "AVX-512 bf16 dot products"},
    "avx512": {"q8_0": "AVX-512 int8 dot products", "q4_0": "AVX2 8x8 repacked blocks",
               "q4_k_m": "AVX2 8x8 repacked blocks (q4_K)"},
    "avx2": {"q8_0": "AVX2 int8 dot products", "q4_0": "AVX2 8x8 repacked blocks",
             "q4_k_m": "AVX2 8x8 repacked blocks (q4_K)"},
    "arm_i8mm": {"q8_0": "i8mm 4x8 repacked blocks", "q4_0": "i8mm 4x8 repacked blocks",
                 "q4_k_m": "i8mm 8x8 repacked blocks (q4_K)"},
    "arm": {"q8_0": "NEON int8 dot products", "q4_0": "NEON 4x4 repacked blocks"},
    "other": {},
}
# torch (transformers serve, vLLM's CPU engine): bf16 matrix products run in oneDNN on AMX and AVX-512 BF16; elsewhere
# bf16 weights are widened to float32 in software, so float32 comes first there.
TORCH = {
    "amx": {"bfloat16": "oneDNN AMX bf16"},
    "avx512_bf16": {"bfloat16": "oneDNN AVX-512 bf16"},
    "arm_i8mm": {"bfloat16": "oneDNN/ACL bf16"},
}
TORCH_FALLBACK = {"float32": "float32 vector kernels"}


def shape(isa):
    """The CPU's shape: the name of the first SHAPES entry whose extensions ISA (cpu_topology's isa) has."""
    isa = isa or {}
    return next(name for name, needs, _ in SHAPES if all(isa.get(flag) for flag in needs))


def favoured(engine, isa):
    """[(format, kernel)] ENGINE runs on fast kernels on a CPU of ISA, in the order to measure them: for llama.cpp
    the fewest bytes per weight first; for torch's engines bf16 first where the CPU multiplies bf16, else float32."""
    cpu = shape(isa)
    if getattr(ENGINES.get(engine), "kernels", "torch") == "ggml":
        fast = LLAMA_CPP[cpu]
        return sorted(fast.items(), key=lambda item: GGUF_BITS[item[0]])
    fast = dict(TORCH.get(cpu, {}))
    fast.update({fmt: kernel for fmt, kernel in TORCH_FALLBACK.items() if fmt not in fast})
    return list(fast.items())


def order(engine, formats, isa):
    """FORMATS (the operator's, for ENGINE) in the order to measure them on a CPU of ISA: those the table favours
    first, in its order, then the rest in the operator's order."""
    ranked = [fmt for fmt, _ in favoured(engine, isa) if fmt in formats]
    return ranked + [fmt for fmt in formats if fmt not in ranked]


def kernel(engine, fmt, isa):
    """The kernel the table expects FMT of ENGINE to run on, or '' where it names none."""
    return dict(favoured(engine, isa)).get(fmt, "")


# --- the kernels an engine reports it ran --------------------------------------------------------------------------

def parse_llama_bench(output):
    """What llama-bench -v OUTPUT says of the kernel path: the ggml CPU variant loaded (libggml-cpu-VARIANT.so), the
    weights' buffers (MiB by buffer type: CPU_Mapped, CPU_REPACK, AMX) and the repacked layouts (tensor counts)."""
    variant = re.findall(r"loaded CPU backend from \S*?libggml-cpu-([^/\s]+)\.so", output)
    buffers = {name: float(size) for name, size in
               re.findall(r"load_tensors:\s+(\S+) model buffer size =\s+([0-9.]+) MiB", output)}
    repacked = {}
    for layout in re.findall(r"^repack: repack tensor \S+ with (\S+)", output, re.MULTILINE):
        repacked[layout] = repacked.get(layout, 0) + 1
    return {"variant": variant[-1] if variant else "", "buffers": buffers, "repacked": repacked}


def llama_cpp_summary(path):
    """One line of PATH (parse_llama_bench's): the variant and where the weights' kernels come from."""
    if not path.get("variant"):
        return "no CPU backend variant reported"
    extra = [name for name in path["buffers"] if name not in ("CPU_Mapped", "CPU", "CPU_REPACK")]
    parts = [f"{layout} x{count}" for layout, count in sorted(path["repacked"].items())]
    if "CPU_REPACK" in path["buffers"]:
        parts.append(f"CPU_REPACK {path['buffers']['CPU_REPACK']} MiB")
    parts += [f"{name} {path['buffers'][name]} MiB" for name in extra]
    return f"ggml-cpu-{path['variant']}" + (f", {', '.join(parts)}" if parts else ", weights as stored")
