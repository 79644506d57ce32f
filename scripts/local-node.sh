#!/usr/bin/env bash
# Starts the local node (the embedded default target): an unprivileged podman container with systemd as PID 1.
# Unprivileged on purpose: a privileged container would write the host's /sys.
set -euo pipefail
. "$(dirname "$0")/env.sh"
name=${1:-llmtune-node}
if [ "$(podman container inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" != true ]; then
  podman rm -f "$name" >/dev/null 2>&1 || true
  podman run -d --name "$name" --hostname "$name" "$LLMTUNE_IMAGE" >/dev/null
fi
state=$(podman exec "$name" systemctl is-system-running --wait || true)
case "$state" in
  running|degraded) echo "== local node $name: systemd $state" ;;
  *) echo "local node $name: systemd is '$state'" >&2; exit 1 ;;
esac
