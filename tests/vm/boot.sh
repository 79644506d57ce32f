#!/usr/bin/env bash
# Runs the test VM in the background.
#   boot.sh prepare   fresh disk for this run (an overlay of the built image) and the image's SSH key
#   boot.sh start     start QEMU (prepare first if there is no disk) and wait for SSH
#   boot.sh wait      wait for SSH (LLMTUNE_VM_BOOT_TIMEOUT seconds, default 600)
#   boot.sh stop      power the VM off
# Files under .cache/vm/run: disk.qcow2, id_ed25519, qemu.pid, serial.log (console of every boot), port.
set -euo pipefail
. "$(dirname "$0")/common.sh"

disk=$LLMTUNE_VM_RUN/disk.qcow2
pidfile=$LLMTUNE_VM_RUN/qemu.pid
serial=$LLMTUNE_VM_RUN/serial.log

vm_pid() { [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && cat "$pidfile"; }

prepare() {
  [ -f "$VM_BASE_IMAGE" ] || die "no image $VM_BASE_IMAGE: run tests/vm/build-image.sh"
  vm_need_packages qemu-img:qemu-utils
  [ -z "$(vm_pid)" ] || die "the VM is running (pid $(vm_pid)): boot.sh stop first"
  rm -f "$disk" "$LLMTUNE_VM_RUN/disk.raw" "$VM_KEY" "$VM_KEY.pub" "$serial"
  install -m 0600 "$VM_BASE_KEY" "$VM_KEY"
  # Copy-on-write over the image (qemu-img(1) create -b): a run writes only what it changes; the full copy of the
  # image took 1.2 GB of disk.
  qemu-img create -q -f qcow2 -F raw -b "$VM_BASE_IMAGE" "$disk"
  log "disk $disk ready over $VM_BASE_IMAGE"
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

# numa_args: one socket per NUMA node, CPUs and memory split evenly (qemu-system(1): -smp, -numa node, -object
# memory-backend-ram). Its CPU and memory sizes must divide evenly.
numa_args() {
  local nodes=$VM_NUMA_NODES node
  [ "$nodes" -ge 1 ] && [ $((VM_CPUS % nodes)) -eq 0 ] && [ $((VM_MEMORY_MB % nodes)) -eq 0 ] ||
    die "LLMTUNE_VM_NUMA_NODES=$nodes must divide the CPUs ($VM_CPUS) and the memory ($VM_MEMORY_MB MiB)"
  echo "-smp $VM_CPUS,sockets=$nodes,cores=$((VM_CPUS / nodes)),threads=1"
  for ((node = 0; node < nodes; node++)); do
    echo "-object memory-backend-ram,id=mem$node,size=$((VM_MEMORY_MB / nodes))M"
    echo "-numa node,nodeid=$node,memdev=mem$node,cpus=$((node * VM_CPUS / nodes))-$(((node + 1) * VM_CPUS / nodes - 1))"
  done
}

start() {
  vm_need_packages qemu-system-x86_64:qemu-system-x86 ssh:openssh-client
  [ -z "$(vm_pid)" ] || die "the VM is already running (pid $(vm_pid))"
  [ -f "$disk" ] || prepare
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
    > "$LLMTUNE_VM_RUN/port"
  local accel_args topology_args
  accel_args=$(accel)
  topology_args=$(numa_args)
  log "starting the VM ($accel_args, $VM_CPUS CPUs and $VM_MEMORY_MB MiB in $VM_NUMA_NODES NUMA nodes, ssh on" \
    "127.0.0.1:$(vm_port))"
  # Output to a file: the daemon would keep a caller's pipe open. accel_args and topology_args are lists of options.
  # shellcheck disable=SC2086
  qemu-system-x86_64 $accel_args $topology_args -m "$VM_MEMORY_MB" -name llmtune-vm \
    -drive "file=$disk,format=qcow2,if=virtio,cache=unsafe" \
    -netdev "user,id=net0,hostfwd=tcp:127.0.0.1:$(vm_port)-:22" -device virtio-net-pci,netdev=net0 \
    -device virtio-rng-pci \
    -chardev "file,id=console,path=$serial,append=on" -serial chardev:console \
    -display none -daemonize -pidfile "$pidfile" >"$LLMTUNE_VM_RUN/qemu.log" 2>&1 ||
    { cat "$LLMTUNE_VM_RUN/qemu.log" >&2; die "QEMU did not start"; }
  # -daemonize makes a new session and so a new autogroup of the scheduler, weighed by its own nice: the caller's.
  { echo "$(nice)" >"/proc/$(cat "$pidfile")/autogroup"; } 2>/dev/null || true
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
