#!/usr/bin/env bash
# The reboot proof in a real VM: build a Debian bookworm disk, boot it in QEMU, record the untuned values,
# run site.yml's tuning with reboots allowed, run its boot-related roles again (0 changed, no reboot), deploy the
# service, reboot, check every setting and the service (tests/vm/checks.yml), roll back, reboot, check the
# originals. The VM is always powered off at the end. Logs and console: .cache/vm/run/.
set -euo pipefail
. "$(dirname "$0")/common.sh"
cd "$LLMTUNE_ROOT"

inventory=$LLMTUNE_ROOT/inventory/vm
timings=()

summary() {
  local rc=$? pid cpu=
  # A TERM that came during the last phase runs its trap at the next command, which would end this one before the
  # VM is off (a stopped test command left its QEMU running): the power-off goes first.
  trap '' TERM INT
  # The emulator's CPU time (every vCPU and the translation): what the VM takes from the work beside it.
  pid=$(cat "$LLMTUNE_VM_RUN/qemu.pid" 2>/dev/null) &&
    cpu=$(awk -v t="$(getconf CLK_TCK)" '{printf "%.0f", ($14 + $15) / t}' "/proc/$pid/stat" 2>/dev/null)
  "$VM_SCRIPTS/boot.sh" stop || true
  printf '\n== phase durations\n'
  printf '  %s\n' "${timings[@]}"
  [ -z "$cpu" ] || printf '  %-18s %4ss\n' "QEMU CPU time" "$cpu"
  if [ "$rc" -eq 0 ]; then echo "== VM scenario passed"; else echo "== VM scenario FAILED (rc $rc), logs in $LLMTUNE_VM_RUN"; fi
}
trap summary EXIT
# Killed runs end through the EXIT trap with the signal's status, not the last command's.
trap 'exit 143' TERM
trap 'exit 130' INT

# phase NAME SECONDS CMD...: runs CMD with a time limit, output also in run/NAME.log, and records its duration.
phase() {
  local name=$1 limit=$2 start=$SECONDS rc=0
  shift 2
  log "phase $name"
  timeout "$limit" "$@" 2>&1 | tee "$LLMTUNE_VM_RUN/$name.log" || rc=${PIPESTATUS[0]}
  timings+=("$(printf '%-18s %4ss%s' "$name" $((SECONDS - start)) "$([ "$rc" -eq 0 ] || echo "  rc=$rc")")")
  [ "$rc" -ne 124 ] || die "phase $name exceeded ${limit}s"
  [ "$rc" -eq 0 ] || die "phase $name failed (rc $rc), log $LLMTUNE_VM_RUN/$name.log"
}

# Per-task durations in the logs: under emulation each task costs seconds.
export ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks
playbook=(ansible-playbook -i "$inventory")
# The tiny test proxy of inventory/vm (built on the controller by site.yml), reboots allowed. No baseline and
# validation benchmarks: figures of an emulated CPU are noise (molecule proves the benchmark), and they cost
# minutes of emulated CPU.
common_args=(-e grub_reboot_ok=true -e proxy_model_preset=qwen3-test-tiny)
site_args=("${common_args[@]}" --skip-tags baseline,validate)

boot_id() { vm_ssh cat /proc/sys/kernel/random/boot_id; }

# recap_changed LOG: hosts with changed != 0 in the PLAY RECAP of LOG.
recap_changed() {
  sed -n '/^PLAY RECAP/,$p' "$1" | grep -E '^\S+ +: ok=' | grep -v ' changed=0 ' || true
}

vm_need_packages qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils ssh:openssh-client
"$VM_SCRIPTS/boot.sh" stop
phase build-image 1200 "$VM_SCRIPTS/build-image.sh"
phase boot 900 bash -c "'$VM_SCRIPTS/boot.sh' prepare && '$VM_SCRIPTS/boot.sh' start"
phase record 600 "${playbook[@]}" tests/vm/checks.yml -e vm_checks_mode=record

before=$(boot_id)
phase site-1 5400 "${playbook[@]}" site.yml "${site_args[@]}" --skip-tags serve
[ "$(boot_id)" != "$before" ] || die "site.yml did not reboot the VM (boot id $before unchanged)"

# The second run proves what only a real host shows: the boot configuration (the THP and C-state parameters, the
# intel_idle file and PM QoS unit, grub's file and its regeneration) changes nothing and reboots nothing. The other
# roles' and the service's second runs are proven by molecule rollback's and default's idempotence (830 s of
# emulated CPU for all roles here). It comes before the service's deploy, which needs the controller's one-off
# llama.cpp build (beside this VM): in one site.yml run the VM waited ~8 minutes for it.
before=$(boot_id)
phase site-2 3600 "${playbook[@]}" site.yml "${site_args[@]}" --tags thp,cstates,grub
[ -z "$(recap_changed "$LLMTUNE_VM_RUN/site-2.log")" ] ||
  die "second site.yml changed something: $(recap_changed "$LLMTUNE_VM_RUN/site-2.log")"
[ "$(boot_id)" = "$before" ] || die "second site.yml rebooted the VM"
log "second site.yml: changed=0 on every host, no reboot"

# One engine per NUMA node. No validation: the benchmark's spread over the engines is molecule llama_cpp's (its
# two-node auto-tune), and checks.yml sends requests through nginx and counts each engine's share after the reboot.
phase serve 3600 "${playbook[@]}" site.yml "${common_args[@]}" --tags serve
# Checked after a reboot: the service and every unit it needs start at boot by themselves, not only because a run
# started them.
phase reboot-served 1500 ansible -i "$inventory" inference_nodes -m ansible.builtin.reboot -a reboot_timeout=1200
[ "$(boot_id)" != "$before" ] || die "the VM did not reboot after the deploy (boot id $before unchanged)"
before=$(boot_id)
# playbooks/verify.yml's drift check is proven by molecule rollback (tuning rows, drift) and llama_cpp (service rows);
# here the second run's changed=0 and these checks cover the same settings on a real kernel, at a fraction of the
# emulated CPU.
phase checks-tuned 900 "${playbook[@]}" tests/vm/checks.yml -e vm_checks_mode=tuned

phase rollback 1800 "${playbook[@]}" playbooks/rollback.yml
# The rollback may reboot by itself; the originals need a boot either way.
if [ "$(boot_id)" = "$before" ]; then
  phase reboot 1500 ansible -i "$inventory" inference_nodes -m ansible.builtin.reboot -a reboot_timeout=1200
fi
phase checks-original 900 "${playbook[@]}" tests/vm/checks.yml -e vm_checks_mode=original
