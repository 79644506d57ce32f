#!/usr/bin/env bash
# Does the validation flap, and does it catch a regression? On the local node of ./scripts/demo.sh: N re-runs of
# site.yml that each measure the validation again (benchmark_revalidate=true) must all pass; then a deliberately worse
# stack (transformers pinned to one thread on one CPU, in the dtype the CPU lacks) must fail the host; a last plain
# run puts the measured stack back and must pass. One line per run: rc, TTFT p50 and decode tokens/s against the
# stored untuned baseline, gain, and the service's paired gap to its direct-run twin (median and range of the rounds,
# decode and end to end, and the rounds taken).
#   tests/rerun-validation.sh [N]     N re-runs (default 10), then the worse stack and the restore
set -euo pipefail
. "$(dirname "$0")/../scripts/env.sh"
cd "$LLMTUNE_ROOT"
n=${1:-10}
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [N]: N re-runs, a whole number >= 1 (got '$n')" >&2; exit 2; }
logs=$LLMTUNE_CACHE/rerun-validation
mkdir -p "$logs"
report=reports/llmtune-node.json

# run NAME EXPECTED_RC ARGS...: site.yml on the local node; prints the run's validation figures.
run() {
  local name=$1 want=$2 rc=0 start=$SECONDS
  shift 2
  ansible-playbook site.yml -i inventory/local "$@" >"$logs/$name.log" 2>&1 || rc=$?
  local figures
  figures=$(python3 - "$report" "$logs/$name.log" <<'EOF'
import json, re, sys
log = open(sys.argv[2], encoding="utf-8", errors="replace").read()
failed = re.search(r"below\s+baseline:.*?<\s*[\d.]+", log, re.S)
try:
    report = json.load(open(sys.argv[1], encoding="utf-8"))
    result, twin = report["result"], report.get("direct_twin") or {}
    s, g = result["summary"], result.get("gain", {})
    r = twin.get("rounds") or {}
    gap = ("twin gap decode %s %% (%s..%s), e2e %s %% (%s..%s), %s rounds" % (
        r["decode_tokens_per_s"]["median"], r["decode_tokens_per_s"]["min"], r["decode_tokens_per_s"]["max"],
        r["e2e_ms"]["median"], r["e2e_ms"]["min"], r["e2e_ms"]["max"], r["rounds"]) if r else
        "twin %s" % twin.get("skipped", "none"))
    print("TTFT p50 %.1f ms, decode %.2f tokens/s, gain %s, %s, measured %s%s" % (
        s["ttft_ms_p50"], s["decode_tokens_per_s"], g.get("decode_tokens_per_s", "-"), gap, result.get("started", "?"),
        ("; " + " ".join(failed.group(0).split())) if failed else ""))
except (OSError, KeyError, ValueError) as error:
    print("no report (%s)%s" % (error, ("; " + " ".join(failed.group(0).split())) if failed else ""))
EOF
)
  printf '%-10s rc %s (want %s) %4ss  %s\n' "$name" "$rc" "$want" $((SECONDS - start)) "$figures"
  [ "$rc" -eq "$want" ] || { echo "== $name: rc $rc, wanted $want (log $logs/$name.log)" >&2; return 1; }
}

for i in $(seq "$n"); do
  run "rerun-$i" 0 -e benchmark_revalidate=true
done
# A failed validation exits 2 (the host failed); a failed report would not exist for this run.
rm -f "$report"
# transformers on one thread and one CPU, in the dtype this CPU does not compute natively: bf16 weights where it lacks
# bf16 instructions, float32 (twice the bytes per token) where it has them. One thread alone is not worse everywhere:
# on a Zen 5 class EPYC, transformers decoded 7.61 tokens/s on one thread in bf16 against 8.09 untuned (x0.94).
worse_dtype=bfloat16
grep -qw -e avx512_bf16 -e amx_bf16 /proc/cpuinfo && worse_dtype=float32
run worse 2 -e llmtune_autotune=false -e inference_service_engine=transformers -e inference_service_dtype=$worse_dtype \
  -e inference_service_threads=1 -e inference_service_cpu_affinity=0
run restore 0
echo "== $n re-runs passed, the worse stack failed, the measured stack is back"
