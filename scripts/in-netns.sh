#!/usr/bin/env bash
# Runs a command inside a network namespace made for it, then removes the
# namespace (also on failure). Chromium gathers no ICE candidates on loopback,
# so browser tests and benchmarks put the coordinator and the browsers on a
# veth pair whose both ends are inside (10.77.0.1 and 10.77.0.2, with a
# default route on one end). Traffic never leaves the namespace. Needs root.
#   bash scripts/in-netns.sh <command> [args...]   (E2E_HOST=10.77.0.1 inside)
set -euo pipefail
if [ "$(id -u)" != 0 ]; then echo "in-netns: network namespaces need root" >&2; exit 1; fi
command -v ip >/dev/null || bash "$(dirname "$0")/apt-install.sh" in-netns iproute2

NS="tah-$$"
cleanup() { ip netns del "$NS" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" link add tah0 type veth peer name tah1
ip -n "$NS" addr add 10.77.0.1/24 dev tah0
ip -n "$NS" addr add 10.77.0.2/24 dev tah1
ip -n "$NS" link set tah0 up
ip -n "$NS" link set tah1 up
# Without a default route Chromium still gathers no host candidates.
ip -n "$NS" route add default dev tah0
E2E_HOST=10.77.0.1 ip netns exec "$NS" "$@"
