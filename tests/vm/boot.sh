#!/usr/bin/env bash
# Runs the test VM in the background.
#   boot.sh prepare   fresh disk (copy of the built image) with a new SSH key pair for this run
#   boot.sh start     start QEMU (prepare first if there is no disk) and wait for SSH
#   boot.sh wait      wait for SSH (LLMTUNE_VM_BOOT_TIMEOUT seconds, default 600)
#   boot.sh stop      power the VM off
# Files under .cache/vm/run: disk.raw, id_ed25519, qemu.pid, serial.log (console of every boot), port.
set -euo pipefail
. "$(dirname "$0")/common.sh"

disk=$LLMTUNE_VM_RUN/disk.raw
pidfile=$LLMTUNE_VM_RUN/qemu.pid
serial=$LLMTUNE_VM_RUN/serial.log

vm_pid() { [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && cat "$pidfile"; }

prepare() {
  [ -f "$VM_BASE_IMAGE" ] || die "no image $VM_BASE_IMAGE: run tests/vm/build-image.sh"
  vm_need_packages ssh-keygen:openssh-client
  [ -z "$(vm_pid)" ] || die "the VM is running (pid $(vm_pid)): boot.sh stop first"
  rm -f "$disk" "$VM_KEY" "$VM_KEY.pub" "$serial"
  ssh-keygen -q -t ed25519 -N '' -C llmtune-vm-test -f "$VM_KEY"
  cp --sparse=always "$VM_BASE_IMAGE" "$disk"
  local loop mnt=$LLMTUNE_VM_RUN/mnt
  loop=$(vm_attach "$disk")
  mkdir -p "$mnt"
  mount "${loop}p1" "$mnt"
  install -m 0600 "$VM_KEY.pub" "$mnt/root/.ssh/authorized_keys"
  umount "$mnt"
  partx -d "$loop" 2>/dev/null || true
  losetup -d "$loop"
  log "disk $disk ready with this run's key"
}

# KVM only when a kernel really runs under it: here /dev/kvm exists and firmware runs, but the kernel hangs.
# The probe boots the image's kernel without a root disk: it panics at once and QEMU exits (-no-reboot).
accel() {
  case ${LLMTUNE_VM_ACCEL:-auto} in
    kvm) echo "-accel kvm -cpu host"; return;;
    tcg) echo "-accel tcg -cpu max"; return;;
  esac
  local probe=$LLMTUNE_VM_RUN/kvm-probe.log
  rm -f "$probe"
  if [ -w /dev/kvm ]; then
    timeout 15 qemu-system-x86_64 -accel kvm -cpu host -m 256 -display none -nodefaults -no-user-config \
      -no-reboot -kernel "$VM_BASE_IMAGE.vmlinuz" -append 'console=ttyS0 panic=-1' -serial "file:$probe" \
      >/dev/null 2>&1 || true
  fi
  if grep -qs 'VFS: Unable to mount root' "$probe"; then echo "-accel kvm -cpu host"; else echo "-accel tcg -cpu max"; fi
}

start() {
  vm_need_packages qemu-system-x86_64:qemu-system-x86 ssh:openssh-client
  [ -z "$(vm_pid)" ] || die "the VM is already running (pid $(vm_pid))"
  [ -f "$disk" ] || prepare
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
    > "$LLMTUNE_VM_RUN/port"
  local accel_args
  accel_args=$(accel)
  log "starting the VM ($accel_args, $VM_CPUS CPUs, $VM_MEMORY_MB MiB, ssh on 127.0.0.1:$(vm_port))"
  # Output to a file: the daemon would keep a caller's pipe open. accel_args is a list of options.
  # shellcheck disable=SC2086
  qemu-system-x86_64 $accel_args -smp "$VM_CPUS" -m "$VM_MEMORY_MB" -name llmtune-vm \
    -drive "file=$disk,format=raw,if=virtio,cache=unsafe" \
    -netdev "user,id=net0,hostfwd=tcp:127.0.0.1:$(vm_port)-:22" -device virtio-net-pci,netdev=net0 \
    -device virtio-rng-pci \
    -chardev "file,id=console,path=$serial,append=on" -serial chardev:console \
    -display none -daemonize -pidfile "$pidfile" >"$LLMTUNE_VM_RUN/qemu.log" 2>&1 ||
    { cat "$LLMTUNE_VM_RUN/qemu.log" >&2; die "QEMU did not start"; }
  wait_ssh
}

wait_ssh() {
  local limit=${LLMTUNE_VM_BOOT_TIMEOUT:-600} start=$SECONDS panics
  panics=$(grep -c 'Kernel panic' "$serial" 2>/dev/null || true)
  while ! vm_ssh true 2>/dev/null; do
    if [ -z "$(vm_pid)" ]; then
      tail -30 "$serial" >&2 || true
      die "QEMU exited during boot (console above, full log $serial)"
    fi
    if [ $((SECONDS - start)) -ge "$limit" ]; then
      tail -30 "$serial" >&2 || true
      die "no SSH after ${limit}s (console above, full log $serial)"
    fi
    sleep 3
  done
  log "SSH up after $((SECONDS - start))s"
  # Said, not hidden: the guest rebooted itself (panic=10 from build-image.sh) before it came up.
  grep 'Kernel panic' "$serial" | tail -n +"$((${panics:-0} + 1))" | sed 's/^/== guest panicked and rebooted: /' || true
}

stop() {
  local pid
  pid=$(vm_pid) || { log "VM not running"; return 0; }
  kill "$pid"
  for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  rm -f "$pidfile"
  log "VM stopped"
}

case ${1:-} in
  prepare) prepare;;
  start) start;;
  wait) wait_ssh;;
  stop) stop;;
  *) die "usage: $0 prepare|start|wait|stop";;
esac
