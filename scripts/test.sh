#!/usr/bin/env bash
# Every test: lint, module docs, unit tests, the molecule scenarios in local podman nodes, and the reboot
# proof in a QEMU VM (tests/vm/run.sh).
# The VM's CPU is emulated: its run needs about 40 minutes of CPU, so it runs beside the molecule scenarios
# at SCHED_IDLE priority (sched(7)): it only gets CPU time no benchmark wants. It starts after the llama_cpp
# scenario, which builds the llama.cpp wheel both use. Its disk image is built during lint and unit tests.
set -euo pipefail
. "$(dirname "$0")/env.sh"
"$LLMTUNE_ROOT/scripts/setup-controller.sh"
cd "$LLMTUNE_ROOT"
start=$SECONDS
step() { printf '== %s (%s s since start)\n' "$1" $((SECONDS - start)); }
vm_log=$LLMTUNE_CACHE/vm/run.log
vm_pid=
stop_vm() {
  if [ -n "$vm_pid" ] && kill -0 "$vm_pid" 2>/dev/null; then kill "$vm_pid"; wait "$vm_pid" || true; fi
  tests/vm/boot.sh stop >/dev/null 2>&1 || true
}
trap stop_vm EXIT

mkdir -p "$LLMTUNE_CACHE/vm"
tests/vm/build-image.sh >"$LLMTUNE_CACHE/vm/build-image.log" 2>&1 &
image_pid=$!

step yamllint; yamllint -s .
step ansible-lint; ansible-lint --profile production
step ansible-doc
for module in library/*.py; do
  ansible-doc -M library "$(basename "$module" .py)" >/dev/null
done
step pytest; python -m pytest tests/unit -q
step "VM image"
wait "$image_pid" || { cat "$LLMTUNE_CACHE/vm/build-image.log"; exit 1; }
tail -1 "$LLMTUNE_CACHE/vm/build-image.log"

step "molecule llama_cpp"; molecule test -s llama_cpp
step "reboot proof in a VM, in the background (log $vm_log)"
chrt --idle 0 tests/vm/run.sh >"$vm_log" 2>&1 &
vm_pid=$!
for scenario in molecule/*/; do
  scenario=$(basename "$scenario")
  [ "$scenario" = llama_cpp ] && continue
  step "molecule $scenario"; molecule test -s "$scenario"
done

step "waiting for the VM"
vm_rc=0
wait "$vm_pid" || vm_rc=$?
vm_pid=
cat "$vm_log"
[ "$vm_rc" -eq 0 ] || { echo "== reboot proof in a VM failed (rc $vm_rc)"; exit "$vm_rc"; }
step done
