#!/usr/bin/env bash
# Starts Debian's redis-server (installed when missing) in the foreground for
# scale-out mode's tests, benches and local trials: loopback only, on a private
# port, nothing written to disk (no snapshots, no append-only file), its
# working folder a temporary one removed on exit.
#   bash scripts/redis.sh [port]          (default 6390)
# Then REDIS_URL=redis://127.0.0.1:<port> for every coordinator process (README.md, "Scale-out").
set -euo pipefail
here=$(dirname "$0")
command -v redis-server >/dev/null || bash "$here/apt-install.sh" redis redis-server
port=${1:-6390}
dir=$(mktemp -d /tmp/tah-redis.XXXXXX)
trap 'rm -rf "$dir"' EXIT
# Not exec: the trap removes the folder once the server exits (SIGTERM from whoever started it is passed on).
# A probe's payload (up to 16 MiB) passed between coordinator processes is one pub/sub message: the default
# limit of a subscriber's output buffer (32 MB, or 8 MB for a minute) would drop the subscriber under a few at once.
redis-server --port "$port" --bind 127.0.0.1 --protected-mode yes --dir "$dir" --save '' --appendonly no \
  --client-output-buffer-limit 'pubsub 512mb 256mb 60' \
  --daemonize no --loglevel warning --logfile '' &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT INT TERM
wait $pid
