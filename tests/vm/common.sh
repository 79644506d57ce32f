# Sourced by the tests/vm scripts: paths, controller packages, SSH to the VM.
# shellcheck shell=bash
VM_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../../scripts/env.sh
. "$VM_SCRIPTS/../../scripts/env.sh"

export LLMTUNE_VM_DIR=${LLMTUNE_VM_DIR:-$LLMTUNE_CACHE/vm}
# One run's files: disk overlay, SSH key, pidfile, serial log, port, logs.
export LLMTUNE_VM_RUN=${LLMTUNE_VM_RUN:-$LLMTUNE_VM_DIR/run}
# The base image is named after the hash of the script that builds it: changing it rebuilds the image.
VM_BASE_IMAGE=$LLMTUNE_VM_DIR/bookworm-$(sha256sum <"$VM_SCRIPTS/build-image.sh" | cut -c1-12).raw
# The SSH key pair made with the image (its public half in the image's authorized_keys), copied for each run.
VM_BASE_KEY=$VM_BASE_IMAGE.id_ed25519
VM_KEY=$LLMTUNE_VM_RUN/id_ed25519
VM_MEMORY_MB=${LLMTUNE_VM_MEMORY_MB:-3072}
VM_CPUS=${LLMTUNE_VM_CPUS:-2}
# Sockets, each its own NUMA node with an equal share of the CPUs and memory (issue #19: servers that run CPU
# inference mostly have several); 1 boots a single-node machine.
VM_NUMA_NODES=${LLMTUNE_VM_NUMA_NODES:-2}
mkdir -p "$LLMTUNE_VM_DIR" "$LLMTUNE_VM_RUN"

log() { printf '== %s %s\n' "$(date +%T)" "$*"; }
die() { printf 'vm: %s\n' "$*" >&2; exit 1; }

# vm_need_packages cmd:package ...: apt-get install the packages whose command is missing.
vm_need_packages() {
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null || PATH=$PATH:/usr/sbin:/sbin command -v "${pair%%:*}" >/dev/null ||
      missing+=("${pair#*:}")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# vm_attach IMAGE: loop device with partition devices; prints the loop device.
# The partition device does not appear by itself here: partx adds it.
vm_attach() {
  local loop
  loop=$(losetup -f --show -P "$1")
  [ -b "${loop}p1" ] || partx -a "$loop" 2>/dev/null || true
  for _ in 1 2 3 4 5 6 7 8 9 10; do [ -b "${loop}p1" ] && break; sleep 0.5; done
  [ -b "${loop}p1" ] || { losetup -d "$loop"; die "${loop}p1 did not appear"; }
  echo "$loop"
}

vm_port() { cat "$LLMTUNE_VM_RUN/port"; }

# QEMU's user network accepts TCP on the forwarded port while the guest is down: always bound the connect.
vm_ssh() {
  ssh -i "$VM_KEY" -p "$(vm_port)" -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
    -o LogLevel=ERROR -o ConnectTimeout=10 -o ServerAliveInterval=5 -o ServerAliveCountMax=3 root@127.0.0.1 "$@"
}
