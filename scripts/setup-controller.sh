#!/usr/bin/env bash
# Installs what the controller needs: Debian packages for local podman nodes, the Python venv with
# Ansible and the test tools, and the local node image. Safe to run again: each step skips when done.
#   scripts/setup-controller.sh [--no-image|--ansible]
#     --no-image: all but the node image (scripts/build-node-image.sh)
#     --ansible: the Debian packages and a venv with Ansible alone, enough to start the one-off builds
#                (playbooks/wheelhouse.yml) while a second run without it installs the rest
set -euo pipefail
image=true ansible_only=false
case "${1:-}" in
  --no-image) image=false ;;
  --ansible) ansible_only=true ;;
  "") ;;
  *) echo "usage: $0 [--no-image|--ansible]" >&2; exit 2 ;;
esac
. "$(dirname "$0")/env.sh"

need_apt=()
# g++, cmake, ninja, patch: llama.cpp has no binary on the registries, the controller patches and compiles it (the
# llama_cpp engine).
for cmd in podman:podman runc:runc debootstrap:debootstrap newuidmap:uidmap slirp4netns:slirp4netns g++:g++ cmake:cmake ninja:ninja-build patch:patch; do
  command -v "${cmd%%:*}" >/dev/null || need_apt+=("${cmd#*:}")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if $ansible_only; then
  if [ ! -x "$LLMTUNE_ROOT/.venv/bin/ansible-playbook" ]; then
    echo "== Python venv (.venv), Ansible first"
    python3 -m venv "$LLMTUNE_ROOT/.venv"
    "$LLMTUNE_ROOT/.venv/bin/pip" install -q "$(grep '^ansible==' "$LLMTUNE_ROOT/requirements.txt")"
  fi
  exit 0
fi

if [ ! -x "$LLMTUNE_ROOT/.venv/bin/ansible-playbook" ] ||
   ! cmp -s "$LLMTUNE_ROOT/requirements.txt" "$LLMTUNE_ROOT/.venv/requirements.installed"; then
  echo "== Python venv (.venv)"
  python3 -m venv "$LLMTUNE_ROOT/.venv"
  # torch first, pinned: 2.13.0 is the CPU wheel; an unpinned torch pulls a multi-GB CUDA build.
  "$LLMTUNE_ROOT/.venv/bin/pip" install -q torch==2.13.0
  "$LLMTUNE_ROOT/.venv/bin/pip" install -q -r "$LLMTUNE_ROOT/requirements.txt"
  cp "$LLMTUNE_ROOT/requirements.txt" "$LLMTUNE_ROOT/.venv/requirements.installed"
fi

# nginx and its njs module for the proxy's tests (tests/unit/test_proxy_nginx.py): the distribution's packages
# unpacked into the cache, not installed, so that no nginx service starts on the controller.
nginx_root=$LLMTUNE_CACHE/nginx
if [ ! -f "$nginx_root/usr/lib/nginx/modules/ngx_http_js_module.so" ]; then
  echo "== nginx (unpacked for the proxy tests)"
  nginx_debs=$(mktemp -d)
  download() { (cd "$nginx_debs" && apt-get download -qq nginx libnginx-mod-http-js 2>/dev/null); }
  download || { apt-get update -qq && download; }
  for deb in "$nginx_debs"/*.deb; do dpkg -x "$deb" "$nginx_root"; done
  rm -rf "$nginx_debs"
fi

# zram-generator for the swap role's tests, which run the real generator in its test mode
# (tests/unit/test_zram_generator_units.py): unpacked into the cache, not installed, since the package's own
# configuration would give the controller a zram swap device at its next boot.
zram_root=$LLMTUNE_CACHE/zram-generator
if [ ! -x "$zram_root/lib/systemd/system-generators/zram-generator" ] &&
   [ ! -x "$zram_root/usr/lib/systemd/system-generators/zram-generator" ]; then
  echo "== systemd-zram-generator (unpacked for the swap tests)"
  zram_debs=$(mktemp -d)
  download() { (cd "$zram_debs" && apt-get download -qq systemd-zram-generator 2>/dev/null); }
  download || { apt-get update -qq && download; }
  for deb in "$zram_debs"/*.deb; do dpkg -x "$deb" "$zram_root"; done
  rm -rf "$zram_debs"
fi

# Debian's prometheus-node-exporter for the metrics tests (tests/unit/test_metrics.py), which scrape the real textfile
# collector: unpacked into the cache, not installed, so that no exporter service starts on the controller.
node_exporter_root=$LLMTUNE_CACHE/prometheus-node-exporter
if [ ! -x "$node_exporter_root/usr/bin/prometheus-node-exporter" ]; then
  echo "== prometheus-node-exporter (unpacked for the metrics tests)"
  exporter_debs=$(mktemp -d)
  download() { (cd "$exporter_debs" && apt-get download -qq prometheus-node-exporter 2>/dev/null); }
  download || { apt-get update -qq && download; }
  for deb in "$exporter_debs"/*.deb; do dpkg -x "$deb" "$node_exporter_root"; done
  rm -rf "$exporter_debs"
fi

! $image || "$LLMTUNE_ROOT/scripts/build-node-image.sh"
