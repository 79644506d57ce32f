#!/bin/sh
# check-cpu-variant.sh DIR GGUF THREADS: run llama-bench of DIR on GGUF (a short prefill and two decoded tokens, the
# kernels the service uses) until ggml's choice of CPU backend variant runs. ggml scores variants by CPUID
# (ggml-cpu/arch/x86/cpu-feats.cpp), but a host may advertise what it cannot run: on a Xeon VM (Linux 6.18) whose
# CPUID shows amx_tile and whose kernel grants XTILEDATA, the sapphirerapids variant's AMX int8 kernel died with
# SIGILL on `tilezero` for q8_0 weights. A variant that dies with SIGILL is moved to DIR/disabled (kept, not
# deleted) and the next best one is tried. Prints "disabled <file>" per variant moved; exit status: llama-bench's.
set -u
dir=$1
gguf=$2
threads=$3
while :; do
  out=$("$dir/llama-bench" --model "$gguf" --threads "$threads" --n-prompt 8 --n-gen 2 --repetitions 1 2>&1)
  rc=$?
  # 128 + SIGILL (4)
  [ "$rc" -eq 132 ] || { [ "$rc" -eq 0 ] || printf '%s\n' "$out" >&2; exit "$rc"; }
  variant=$(printf '%s\n' "$out" | sed -n 's|.*loaded CPU backend from \(.*/libggml-cpu-[^/ ]*\.so\).*|\1|p' | tail -n 1)
  [ -n "$variant" ] && [ -f "$variant" ] || { printf '%s\n' "$out" >&2; exit "$rc"; }
  mkdir -p "$dir/disabled"
  mv "$variant" "$dir/disabled/"
  echo "disabled $(basename "$variant")"
done
