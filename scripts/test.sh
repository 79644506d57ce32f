#!/usr/bin/env bash
# Every test: lint, module docs, unit tests, the molecule scenarios in local podman nodes, and the reboot
# proof in a QEMU VM (tests/vm/run.sh).
# The VM's CPU is emulated and needs about half an hour of CPU, so it runs beside the scenarios whose figures
# gate nothing (llama_cpp: API checks; rollback: no service; fleet: a tiny proxy, no threshold but an impossible
# one), never beside a benchmark that counts: next to two emulated CPUs, llama.cpp decode fell from ~40 to
# 3.5 tokens/s even at SCHED_IDLE priority. The scenarios before it (autotune) build the llama.cpp wheel it uses.
# Its disk image is built during lint and unit tests, which measure nothing either.
set -euo pipefail
. "$(dirname "$0")/env.sh"
"$LLMTUNE_ROOT/scripts/setup-controller.sh"
cd "$LLMTUNE_ROOT"
start=$SECONDS
step() { printf '== %s (%s s since start)\n' "$1" $((SECONDS - start)); }
mkdir -p "$LLMTUNE_CACHE/vm"
vm_log=$LLMTUNE_CACHE/vm/run.log
vm_pid=
# On a failure elsewhere: the VM run's whole process group, so that its EXIT trap powers the VM off at once.
stop_vm() {
  if [ -n "$vm_pid" ] && kill -0 "$vm_pid" 2>/dev/null; then kill -- "-$vm_pid"; wait "$vm_pid" || true; fi
}
trap stop_vm EXIT

tests/vm/build-image.sh >"$LLMTUNE_CACHE/vm/build-image.log" 2>&1 &
image_pid=$!

# Unit tests beside the linters: each keeps one CPU busy.
pytest_log=$LLMTUNE_CACHE/pytest.log
python -m pytest tests/unit -q >"$pytest_log" 2>&1 &
pytest_pid=$!
step yamllint; yamllint -s .
step ansible-lint; ansible-lint --profile production
step ansible-doc
for module in library/*.py; do
  ansible-doc -M library "$(basename "$module" .py)" >/dev/null
done
step pytest
wait "$pytest_pid" || { cat "$pytest_log"; exit 1; }
tail -1 "$pytest_log"
step "VM image"
wait "$image_pid" || { cat "$LLMTUNE_CACHE/vm/build-image.log"; exit 1; }
tail -1 "$LLMTUNE_CACHE/vm/build-image.log"

beside_vm=(llama_cpp rollback fleet)
for scenario in molecule/*/; do
  scenario=$(basename "$scenario")
  [[ " ${beside_vm[*]} " == *" $scenario "* ]] && continue
  step "molecule $scenario"; molecule test -s "$scenario"
done

# The VM and the fleet scenario both serve the tiny proxy: built once, before either starts.
step "tiny proxy model"
ansible-playbook playbooks/proxy_model.yml -e proxy_model_preset=qwen3-test-tiny
step "reboot proof in a VM, in the background (log $vm_log)"
setsid tests/vm/run.sh >"$vm_log" 2>&1 &
vm_pid=$!
for scenario in "${beside_vm[@]}"; do
  step "molecule $scenario"; molecule test -s "$scenario"
done
step "waiting for the VM"
vm_rc=0
wait "$vm_pid" || vm_rc=$?
vm_pid=
if [ "$vm_rc" -ne 0 ]; then cat "$vm_log"; echo "== reboot proof in a VM failed (rc $vm_rc)"; exit "$vm_rc"; fi
# The evidence: each check table, then the phase durations.
sed -n '/Show setting, wanted and observed/,/^$/p;/^== phase durations/,$p' "$vm_log"
step done
