#!/usr/bin/env bash
# Builds the local node image without a registry: debootstrap Debian bookworm with systemd and python3,
# then `podman import` with systemd as the command. Skips when the image exists and was built by this script as
# it is now (its hash is a label of the image).
set -euo pipefail
. "$(dirname "$0")/env.sh"

script_hash=$(sha256sum <"${BASH_SOURCE[0]}" | cut -c1-16)
if [ "$(podman image inspect -f '{{ index .Config.Labels "llmtune.script" }}' "$LLMTUNE_IMAGE" 2>/dev/null)" = "$script_hash" ]; then
  echo "== image $LLMTUNE_IMAGE present"
  exit 0
fi
echo "== building $LLMTUNE_IMAGE with debootstrap (about 2 minutes)"
rootfs=$(mktemp -d "$LLMTUNE_CACHE/rootfs.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT
# curl: operators call the service from the node (docs/serving.md, "Calling the service").
# grub2-common ships /etc/default/grub and update-grub, so the grub role edits a real file.
debootstrap --variant=minbase \
  --include=systemd,systemd-sysv,dbus,python3,python3-venv,python3-apt,ca-certificates,procps,kmod,grub2-common,iproute2,curl \
  bookworm "$rootfs" "$LLMTUNE_MIRROR" >"$LLMTUNE_CACHE/debootstrap.log" 2>&1 ||
  { tail -20 "$LLMTUNE_CACHE/debootstrap.log"; exit 1; }
# grub-pc's postinst installs this default file on a real host; the image has no bootloader package.
cp "$rootfs/usr/share/grub/default/grub" "$rootfs/etc/default/grub"
# As Debian's own container images do (docker-clean): the packages apt downloads are deleted once installed (each
# scenario's node kept about 130 MB of them; a full disk failed CI). DPkg::Post-Invoke runs after each dpkg call
# of any apt front end, python3-apt's too (apt.conf(5)).
cat > "$rootfs/etc/apt/apt.conf.d/llmtune-clean" <<'APT'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb || true"; };
APT
# An empty machine-id makes systemd generate one per container at first boot.
: > "$rootfs/etc/machine-id"
tar -C "$rootfs" -c . | podman import \
  --change 'CMD ["/lib/systemd/systemd"]' \
  --change 'ENV container=podman' \
  --change 'STOPSIGNAL SIGRTMIN+3' \
  --change "LABEL llmtune.script=$script_hash" - "$LLMTUNE_IMAGE" >/dev/null
echo "== image $LLMTUNE_IMAGE built"
