#!/usr/bin/env bash
# Installs what the controller needs: Debian packages for local podman nodes, the Python venv with
# Ansible and the test tools, and the local node image. Safe to run again: each step skips when done.
#   scripts/setup-controller.sh [--no-image|--ansible]
#     --no-image: all but the node image (scripts/build-node-image.sh)
#     --ansible: the Debian packages and a venv with Ansible and its strategy (Mitogen) alone, enough to start the
#                one-off builds (playbooks/wheelhouse.yml) while a second run without it installs the rest
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
    # shellcheck disable=SC2046 # one word per package
    "$LLMTUNE_ROOT/.venv/bin/pip" install -q $(grep -E '^(ansible|mitogen)==' "$LLMTUNE_ROOT/requirements.txt")
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

# Debian packages the unit tests run for real, unpacked into the cache (ROOT), not installed, so that no service of
# theirs starts on the controller and none of their configuration applies to it.
#   unpack ROOT WHAT PACKAGE...
unpack() {
  local root=$1 what=$2 debs
  shift 2
  echo "== $* (unpacked for $what)"
  debs=$(mktemp -d)
  download() { (cd "$debs" && apt-get download -qq "$@" 2>/dev/null); }
  download "$@" || { apt-get update -qq && download "$@"; }
  for deb in "$debs"/*.deb; do dpkg -x "$deb" "$root"; done
  rm -rf "$debs"
}
# nginx and its njs module: the proxy's tests (tests/unit/test_proxy_nginx.py, test_metrics.py).
[ -f "$LLMTUNE_CACHE/nginx/usr/lib/nginx/modules/ngx_http_js_module.so" ] ||
  unpack "$LLMTUNE_CACHE/nginx" "the proxy tests" nginx libnginx-mod-http-js
# zram-generator: the swap role's tests run the real generator in its test mode (tests/unit/test_zram_generator_units.py);
# its own configuration would give the controller a zram swap device at its next boot.
[ -x "$LLMTUNE_CACHE/zram-generator/lib/systemd/system-generators/zram-generator" ] ||
  [ -x "$LLMTUNE_CACHE/zram-generator/usr/lib/systemd/system-generators/zram-generator" ] ||
  unpack "$LLMTUNE_CACHE/zram-generator" "the swap tests" systemd-zram-generator
# The node exporter: the metrics tests scrape its real textfile collector (tests/unit/test_metrics.py).
[ -x "$LLMTUNE_CACHE/prometheus-node-exporter/usr/bin/prometheus-node-exporter" ] ||
  unpack "$LLMTUNE_CACHE/prometheus-node-exporter" "the metrics tests" prometheus-node-exporter
# HAProxy and socat, its runtime API's client: the balancer's tests run the role's configuration and its drain
# (tests/unit/test_balancer.py).
[ -x "$LLMTUNE_CACHE/haproxy/usr/sbin/haproxy" ] && [ -x "$LLMTUNE_CACHE/haproxy/usr/bin/socat" ] ||
  unpack "$LLMTUNE_CACHE/haproxy" "the balancer tests" haproxy liblua5.3-0 libopentracing-c-wrapper0 libopentracing1 \
    socat libwrap0

! $image || "$LLMTUNE_ROOT/scripts/build-node-image.sh"
