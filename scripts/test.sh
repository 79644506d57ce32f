#!/usr/bin/env bash
# Every test: lint, module docs, unit tests, the molecule scenarios in local podman nodes, then the reboot
# proof in a QEMU VM (tests/vm/run.sh). The VM runs after the scenarios, not beside them: an emulated CPU
# running next to a benchmark cuts its figures several-fold (llama.cpp decode fell from ~40 to 3.5 tokens/s
# with two VMs at SCHED_IDLE). Its disk image is built during lint and unit tests, which measure nothing.
set -euo pipefail
. "$(dirname "$0")/env.sh"
"$LLMTUNE_ROOT/scripts/setup-controller.sh"
cd "$LLMTUNE_ROOT"
start=$SECONDS
step() { printf '== %s (%s s since start)\n' "$1" $((SECONDS - start)); }

mkdir -p "$LLMTUNE_CACHE/vm"
image_log=$LLMTUNE_CACHE/vm/build-image.log
tests/vm/build-image.sh >"$image_log" 2>&1 &
image_pid=$!

step yamllint; yamllint -s .
step ansible-lint; ansible-lint --profile production
step ansible-doc
for module in library/*.py; do
  ansible-doc -M library "$(basename "$module" .py)" >/dev/null
done
step pytest; python -m pytest tests/unit -q
step "VM image"
wait "$image_pid" || { cat "$image_log"; exit 1; }
tail -1 "$image_log"
step molecule; molecule test --all
step "reboot proof in a VM"; tests/vm/run.sh
step done
