#!/usr/bin/env bash
# The main job on the embedded default target: sets up the controller, starts the local node, runs site.yml.
set -euo pipefail
. "$(dirname "$0")/env.sh"
# The local node has the controller's CPU: llama.cpp's build keeps only the CPU variants it loads (2-3 of 14).
export LLMTUNE_LLAMA_CPP_CPU_VARIANTS=${LLMTUNE_LLAMA_CPP_CPU_VARIANTS-host}
"$LLMTUNE_ROOT/scripts/setup-controller.sh" --no-image
cd "$LLMTUNE_ROOT"
# The one-off builds in two lanes: the node image (downloads and dpkg, mostly waiting) beside the engines'
# wheelhouses and the llama.cpp compile that the auto-tune stage needs (CPU). site.yml starts when both are done, so
# nothing it measures shares the CPUs with a build. Each build skips when its result is there.
builds_log=$LLMTUNE_CACHE/demo-wheelhouses.log
echo "== wheelhouses and the llama.cpp build, in the background (log $builds_log)"
setsid ansible-playbook playbooks/wheelhouse.yml -e '{"wheelhouse_engines": ["transformers", "llama_cpp"]}' >"$builds_log" 2>&1 &
builds_pid=$!
# Should the image build fail: the compile's whole process group, not an orphaned compiler.
trap 'kill -- "-$builds_pid" 2>/dev/null || true' EXIT
"$LLMTUNE_ROOT/scripts/build-node-image.sh"
wait "$builds_pid" || { tail -30 "$builds_log"; echo "== the wheelhouse builds failed, log $builds_log" >&2; exit 1; }
trap - EXIT
"$LLMTUNE_ROOT/scripts/local-node.sh" llmtune-node
ansible-playbook site.yml -i inventory/local "$@"
