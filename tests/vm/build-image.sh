#!/usr/bin/env bash
# Builds a bootable Debian bookworm disk for the reboot scenario: raw disk, one MBR partition, ext4, GRUB
# (i386-pc) on the disk, serial console, a swap file in fstab, systemd-networkd on DHCP, sshd.
# Cached as .cache/vm/bookworm-<hash of this script>.raw; about 2 minutes when it has to be built.
set -euo pipefail
. "$(dirname "$0")/common.sh"

if [ -f "$VM_BASE_IMAGE" ]; then
  log "image $VM_BASE_IMAGE present"
  exit 0
fi
vm_need_packages debootstrap:debootstrap sfdisk:fdisk mkfs.ext4:e2fsprogs partx:util-linux losetup:mount \
  ssh-keygen:openssh-client

# Packages the scenario needs in the guest, so nothing is installed from the network at test time:
# python3-venv/-packaging for the inference service's venv, python3-apt for Ansible's package module,
# libgomp1 for llama.cpp, numactl for the checks' view of the NUMA nodes.
include=systemd-sysv,dbus,udev,kmod,procps,iproute2,openssh-server,sudo,ca-certificates,initramfs-tools,\
python3,python3-venv,python3-packaging,python3-apt,libgomp1,numactl
disk_gb=8
swap_mb=512

tmp=$VM_BASE_IMAGE.tmp
mnt=$LLMTUNE_VM_DIR/mnt
loop=
uuid_link=
cleanup() {
  if [ -n "$uuid_link" ]; then rm -f "$uuid_link"; rmdir /dev/disk/by-uuid /dev/disk 2>/dev/null || true; fi
  if mountpoint -q "$mnt"; then umount -R "$mnt"; fi
  if [ -n "$loop" ]; then partx -d "$loop" 2>/dev/null || true; losetup -d "$loop"; fi
  rm -f "$tmp" "$tmp.vmlinuz" "$tmp.id_ed25519" "$tmp.id_ed25519.pub"
}
trap cleanup EXIT

log "building $VM_BASE_IMAGE (debootstrap, kernel, GRUB; about 2 minutes)"
rm -f "$tmp"
truncate -s "${disk_gb}G" "$tmp"
echo 'start=2048, type=83, bootable' | sfdisk -q "$tmp"
loop=$(vm_attach "$tmp")
mkfs.ext4 -q -L llmtune-root "${loop}p1"
mkdir -p "$mnt"
mount "${loop}p1" "$mnt"

mkdir -p "$LLMTUNE_VM_DIR/debs"
debootstrap --include="$include" --cache-dir="$LLMTUNE_VM_DIR/debs" bookworm "$mnt" "$LLMTUNE_MIRROR" \
  >"$LLMTUNE_VM_DIR/debootstrap.log" 2>&1 || { tail -20 "$LLMTUNE_VM_DIR/debootstrap.log"; exit 1; }

# A small initrd (virtio and ext4 only) unpacks in seconds instead of a minute under emulation.
mkdir -p "$mnt/etc/initramfs-tools/conf.d"
echo MODULES=list > "$mnt/etc/initramfs-tools/conf.d/llmtune-vm.conf"
printf '%s\n' virtio_pci virtio_blk virtio_net crc32c_generic ext4 >> "$mnt/etc/initramfs-tools/modules"

uuid=$(blkid -s UUID -o value "${loop}p1")
cat > "$mnt/etc/fstab" <<FSTAB
UUID=$uuid / ext4 errors=remount-ro 0 1
/swapfile none swap sw 0 0
FSTAB
# A real swap area in fstab, so the swap role has something to turn off.
dd if=/dev/zero of="$mnt/swapfile" bs=1M count="$swap_mb" status=none
chmod 600 "$mnt/swapfile"
mkswap -q "$mnt/swapfile"

echo llmtune-vm > "$mnt/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 llmtune-vm\n' > "$mnt/etc/hosts"
cat > "$mnt/etc/systemd/network/80-dhcp.network" <<NET
[Match]
Name=en* eth*

[Network]
DHCP=ipv4
NET
install -d -m 0700 "$mnt/root/.ssh"
ssh-keygen -q -t ed25519 -N '' -C llmtune-vm-test -f "$tmp.id_ed25519"
install -m 0600 "$tmp.id_ed25519.pub" "$mnt/root/.ssh/authorized_keys"
# Each boot generates its own machine-id.
: > "$mnt/etc/machine-id"

mount --bind /dev "$mnt/dev"
mount -t proc proc "$mnt/proc"
mount -t sysfs sysfs "$mnt/sys"
chroot "$mnt" systemctl enable -q systemd-networkd
DEBIAN_FRONTEND=noninteractive chroot "$mnt" apt-get install -y -qq --no-install-recommends \
  linux-image-amd64 grub-pc >>"$LLMTUNE_VM_DIR/debootstrap.log" 2>&1 ||
  { tail -20 "$LLMTUNE_VM_DIR/debootstrap.log"; exit 1; }
chroot "$mnt" apt-get clean
# GRUB and the kernel on the serial console (the boot log is the test's evidence); no "quiet". Edited in
# place, as an operator would: the grub role must find one GRUB_CMDLINE_LINUX line. THP starts at madvise
# from the command line, so that the tuning must replace a parameter (once) and the rollback bring it back.
# panic=10: a panicking guest reboots instead of hanging until the SSH wait gives up (in CI of cdb8a82 the
# initramfs' run-init failed once, "nuking initramfs contents: Directory not empty", beside the llama.cpp compile;
# the same image booted at the next try). hung_task_panic=1: so does a boot whose tasks stay blocked past the
# hung-task detector's 120 s (in the clean-clone run of 812baf6, the boot after the rollback stopped in the
# initramfs: synchronize_rcu in do_free_init never returned, udev's worker blocked, beside two molecule scenarios).
sed -i -e 's/^GRUB_TIMEOUT=.*/GRUB_TIMEOUT=1/' \
  -e 's/^GRUB_CMDLINE_LINUX_DEFAULT=.*/GRUB_CMDLINE_LINUX_DEFAULT=""/' \
  -e 's/^GRUB_CMDLINE_LINUX=.*/GRUB_CMDLINE_LINUX="console=ttyS0,115200n8 transparent_hugepage=madvise panic=10 hung_task_panic=1"/' \
  -e 's/^#\?GRUB_TERMINAL=.*/GRUB_TERMINAL="serial console"\nGRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"/' \
  "$mnt/etc/default/grub"
chroot "$mnt" grub-install --target=i386-pc "$loop" >>"$LLMTUNE_VM_DIR/debootstrap.log" 2>&1
# grub-mkconfig writes root=UUID= only when /dev/disk/by-uuid has the link, which udev makes on a real host.
uuid_link=/dev/disk/by-uuid/$uuid
mkdir -p /dev/disk/by-uuid
ln -sf "${loop}p1" "$uuid_link"
chroot "$mnt" update-grub >>"$LLMTUNE_VM_DIR/debootstrap.log" 2>&1
grep -q "root=UUID=$uuid" "$mnt/boot/grub/grub.cfg" || die "grub.cfg does not boot UUID=$uuid"

# The kernel alone, for boot.sh's KVM probe.
cp "$(readlink -f "$mnt/vmlinuz")" "$tmp.vmlinuz"
umount -R "$mnt"
partx -d "$loop" 2>/dev/null || true
losetup -d "$loop"
loop=
mv "$tmp.vmlinuz" "$VM_BASE_IMAGE.vmlinuz"
mv "$tmp.id_ed25519" "$VM_BASE_KEY"
mv "$tmp.id_ed25519.pub" "$VM_BASE_KEY.pub"
mv "$tmp" "$VM_BASE_IMAGE"
# Images of older versions of this script are dead weight.
find "$LLMTUNE_VM_DIR" -maxdepth 1 -name 'bookworm-*.raw*' ! -name "$(basename "$VM_BASE_IMAGE")*" -delete
log "image $VM_BASE_IMAGE built"
