#!/usr/bin/env bash
# The main job on the embedded default target: sets up the controller, starts the local node, runs site.yml, and
# prints how long each part took, the one-off builds apart.
set -euo pipefail
. "$(dirname "$0")/env.sh"
cd "$LLMTUNE_ROOT"
start=$SECONDS
parts=()
took() { parts+=("$(printf '%-66s %6d' "$1" $((SECONDS - $2)))"); }
show_parts() {
  printf '\n== demo: wall seconds per part\n'
  printf '%s\n' "${parts[@]}"
  printf '%-66s %6d\n' total $((SECONDS - start))
}
trap show_parts EXIT
t=$SECONDS
scripts/setup-controller.sh --ansible
took "controller set-up: apt packages, Ansible (one-off)" "$t"
# The llama.cpp compile is the longest one-off (about 6 minutes on 2 cores) and keeps the CPUs busy; the rest of the
# venv (pip) and the node image (debootstrap) wait mostly on the network and the disk, so they are installed beside
# the compile. site.yml then finds them.
t=$SECONDS
builds_log=$LLMTUNE_CACHE/demo-builds.log
echo "== one-off builds in the background: transformers wheelhouse, llama.cpp compile (log $builds_log)"
LLMTUNE_LLAMA_CPP_CPU_VARIANTS=host ansible-playbook playbooks/wheelhouse.yml \
  -e '{"wheelhouse_engines": ["transformers", "llama_cpp"]}' >"$builds_log" 2>&1 &
builds=$!
t2=$SECONDS
scripts/setup-controller.sh --no-image
took "controller set-up: the rest of the venv (one-off, beside the builds)" "$t2"
t2=$SECONDS
scripts/build-node-image.sh
scripts/local-node.sh llmtune-node
took "node image and local node (one-off image, beside the builds)" "$t2"
# site.yml would build it first thing (playbooks/proxy_model.yml): here too, beside the compile.
t2=$SECONDS
ansible-playbook playbooks/proxy_model.yml
took "proxy model (one-off, beside the builds)" "$t2"
wait "$builds" || { tail -n 40 "$builds_log" >&2; echo "the one-off builds failed (log $builds_log)" >&2; exit 1; }
took "wheelhouse and llama.cpp compile (one-off, from their start)" "$t"
t=$SECONDS
ansible-playbook site.yml -i inventory/local "$@"
took "site.yml" "$t"
# What is served and its gain (reports/summary.md), and where the auto-tune's table is.
printf '\n== served (%s; the auto-tune: %s)\n' "$LLMTUNE_ROOT/reports/summary.md" "$LLMTUNE_ROOT/reports/llmtune-node-autotune.md"
grep -E '^[|] (host|llmtune-node) ' "$LLMTUNE_ROOT/reports/summary.md" || true
