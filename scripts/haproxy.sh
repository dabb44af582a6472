#!/usr/bin/env bash
# A load balancer in front of several coordinator processes (scale-out mode):
# Debian's haproxy (installed when missing), in the foreground, its
# configuration written to a temporary folder removed on exit.
#   bash scripts/haproxy.sh <listen-port> <host:port> [<host:port>…]
#   bash scripts/haproxy.sh --print <listen-port> <host:port>…   (only print the configuration)
# What it does, and what an operator's balancer needs (README.md, "Scale-out"):
# - A new connection goes to the process with the fewest open (leastconn:
#   miners' connections last hours, so that is the process with the fewest miners).
# - WebSocket upgrades pass through (`timeout tunnel`: a miner's connection
#   lives for hours); miners use WebSocket only, so no sticky sessions are
#   needed for them. The dashboard may fall back to long-polling, which needs
#   its requests on one process: the `tah` cookie pins a browser to one.
# - Each coordinator is checked every second (GET /api/status); one that does
#   not answer twice is taken out, and a connection refused by a dead one is
#   sent to another (redispatch), so a miner whose process died reconnects to
#   a live one at its next try.
# - X-Forwarded-For names the client: start every coordinator with
#   --trust-proxy <this balancer's address> (TAH_TRUST_PROXY), so its rate
#   limits count clients, not the balancer. The per-IP connection cap moves
#   here (a stick table of each client's open connections).
set -euo pipefail
here=$(dirname "$0")
print=0
if [ "${1:-}" = --print ]; then print=1; shift; fi
if [ $# -lt 2 ]; then
  echo "usage: bash scripts/haproxy.sh [--print] <listen-port> <host:port> [<host:port>…]" >&2
  exit 2
fi
port=$1
shift
max_conn_per_ip=${TAH_MAX_CONNECTIONS_PER_IP:-256}
# Each proxied connection holds two descriptors: as many as this user's limit allows, up to 50,000.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
maxconn=$(( ($(ulimit -n) - 200) / 2 ))
[ "$maxconn" -gt 50000 ] && maxconn=50000
bind=${TAH_BALANCER_BIND:-127.0.0.1}

config() {
  cat <<EOF
global
  maxconn ${maxconn}

defaults
  mode http
  option forwardfor
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  # An upgraded connection (WebSocket) stays open while either side speaks; socket.io pings every 25 s.
  timeout tunnel 1h
  timeout http-request 20s
  # A refused connection is tried again, on another process.
  retries 3
  option redispatch

frontend coordinators
  bind ${bind}:${port}
  stick-table type ip size 1m store conn_cur
  tcp-request connection track-sc0 src
  tcp-request connection reject if { sc0_conn_cur gt ${max_conn_per_ip} }
  maxconn ${maxconn}
  default_backend coordinators

backend coordinators
  # A miner's connection lasts hours: a new one goes to the process holding the fewest.
  balance leastconn
  option httpchk GET /api/status
  http-check expect status 200
  default-server inter 1s fall 2 rise 2
  cookie tah insert indirect nocache
EOF
  local i=0
  for server in "$@"; do
    i=$((i + 1))
    echo "  server c$i $server check cookie c$i"
  done
}

if [ $print = 1 ]; then
  config "$@"
  exit 0
fi
command -v haproxy >/dev/null || bash "$here/apt-install.sh" haproxy haproxy
dir=$(mktemp -d /tmp/tah-haproxy.XXXXXX)
config "$@" >"$dir/haproxy.cfg"
haproxy -c -q -f "$dir/haproxy.cfg"
# Not exec: the trap removes the folder once haproxy exits (SIGTERM from whoever started it is passed on).
haproxy -db -f "$dir/haproxy.cfg" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT INT TERM
wait $pid
