#!/usr/bin/env bash
# The main job on the embedded default target: sets up the controller, starts the local node, runs site.yml.
set -euo pipefail
. "$(dirname "$0")/env.sh"
"$LLMTUNE_ROOT/scripts/setup-controller.sh"
"$LLMTUNE_ROOT/scripts/local-node.sh" llmtune-node
cd "$LLMTUNE_ROOT"
ansible-playbook site.yml -i inventory/local "$@"
