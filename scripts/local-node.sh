#!/usr/bin/env bash
# Starts the local node (the embedded default target): an unprivileged podman container with systemd as PID 1.
# Unprivileged on purpose: a privileged container would write the host's /sys.
set -euo pipefail
. "$(dirname "$0")/env.sh"
name=${1:-llmtune-node}
if [ "$(podman container inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" != true ]; then
  podman rm -f "$name" >/dev/null 2>&1 || true
  # /dev/shm of half the memory, as a host's tmpfs default (podman gives 64 MiB; vLLM's processes share 160 MiB).
  shm_kib=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 2))
  podman run -d --name "$name" --hostname "$name" --shm-size "${shm_kib}k" "$LLMTUNE_IMAGE" >/dev/null
fi
# Right after `podman run`, systemd may not have its bus yet ("Failed to connect to bus"): ask again.
for _ in $(seq 30); do
  state=$(podman exec "$name" systemctl is-system-running --wait 2>/dev/null || true)
  [ -n "$state" ] && break
  sleep 1
done
case "$state" in
  running|degraded) echo "== local node $name: systemd $state" ;;
  *) echo "local node $name: systemd is '$state'" >&2; exit 1 ;;
esac
