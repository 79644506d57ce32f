# Sourced by the scripts in this folder: one place for the controller's paths and podman settings.
# shellcheck shell=bash
LLMTUNE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export LLMTUNE_CACHE=${LLMTUNE_CACHE:-$LLMTUNE_ROOT/.cache}
LLMTUNE_IMAGE=${LLMTUNE_IMAGE:-localhost/llmtune-node:bookworm}
LLMTUNE_MIRROR=${LLMTUNE_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$LLMTUNE_CACHE"

# podman on a host without systemd and with hybrid cgroups (see docs/local-node.md): runc, cgroupfs,
# file events, and ulimits no higher than this shell's hard limits (podman asks for more otherwise).
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
[ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
[ "$nofile" = unlimited ] && nofile=1048576
cat > "$LLMTUNE_CACHE/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
export CONTAINERS_CONF=$LLMTUNE_CACHE/containers.conf
export PATH=$LLMTUNE_ROOT/.venv/bin:$PATH
export ANSIBLE_CONFIG=$LLMTUNE_ROOT/ansible.cfg
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
