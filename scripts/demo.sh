#!/usr/bin/env bash
# The main job on the embedded default target: sets up the controller, starts the local node, runs site.yml.
set -euo pipefail
. "$(dirname "$0")/env.sh"
# The local node has the controller's CPU: llama.cpp's build keeps only the CPU variants it loads (2-3 of 14).
export LLMTUNE_LLAMA_CPP_CPU_VARIANTS=${LLMTUNE_LLAMA_CPP_CPU_VARIANTS-host}
"$LLMTUNE_ROOT/scripts/setup-controller.sh"
"$LLMTUNE_ROOT/scripts/local-node.sh" llmtune-node
cd "$LLMTUNE_ROOT"
ansible-playbook site.yml -i inventory/local "$@"
