#!/bin/sh
# host-cpu-variants.sh SOURCE [CPUINFO]: the x86 CPU variants of llama.cpp SOURCE's ggml that this CPU would load
# (CPUINFO, default /proc/cpuinfo), one per line: the best one by ggml's own score, then the fallback that
# library/llama_cpp_probe.py moves to when a variant dies with SIGILL, the best without AMX (whose int8 kernel died on
# a Xeon VM that advertised it). Each variant costs about 100 CPU-s of the compile. Features per variant come from
# SOURCE's ggml/src/CMakeLists.txt; each feature's weight and the flags it needs (proc(5) cpuinfo names) follow
# ggml_backend_cpu_x86_score in ggml/src/ggml-cpu/arch/x86/cpu-feats.cpp. Nothing printed: no x86 variant runs here.
set -eu
src=$1
cpuinfo=${2:-/proc/cpuinfo}
flags=" $(sed -n 's/^flags[[:space:]]*: //p' "$cpuinfo" | head -n 1) "
# Not x86 (Arm names its features "Features"): nothing to choose here.
[ "$flags" != "  " ] || exit 0
sed -n 's/^ *ggml_add_cpu_backend_variant(\([^)]*\)).*/\1/p' "$src/ggml/src/CMakeLists.txt" |
  awk -v flags="$flags" '
    BEGIN {
      split("FMA:1:fma F16C:2:f16c SSE42:4:sse4_2 BMI2:8:bmi2 AVX:16:avx AVX2:32:avx2 AVX_VNNI:64:avx_vnni " \
            "AVX512:128:avx512f,avx512cd,avx512vl,avx512dq,avx512bw AVX512_VBMI:256:avx512vbmi " \
            "AVX512_BF16:512:avx512_bf16 AVX512_VNNI:1024:avx512_vnni AMX_INT8:2048:amx_int8 AMX_TILE:0:amx_tile", f, " ")
      for (i in f) { split(f[i], p, ":"); weight[p[1]] = p[2]; needs[p[1]] = p[3] }
    }
    # x86 variants only: every feature known (the Arm ones are not) and present.
    {
      score = 1
      for (i = 2; i <= NF; i++) {
        if (!($i in needs)) next
        n = split(needs[$i], want, ",")
        for (j = 1; j <= n; j++) if (index(flags, " " want[j] " ") == 0) next
        score += weight[$i]
      }
      if ($1 != "x64" && NF == 1) next
      if (score > best) { best = score; name = $1 }
      if (index($0, " AMX_") == 0 && score > best_no_amx) { best_no_amx = score; no_amx = $1 }
    }
    END {
      if (name != "") print name
      if (no_amx != name) print no_amx
    }'
