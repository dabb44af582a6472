#!/usr/bin/env bash
# Runs the coordinator's tests against a real PostgreSQL server: Debian's
# postgresql, started here on a private port and socket folder in a temporary
# directory, and removed afterwards (also on failure).
set -euo pipefail
cd "$(dirname "$0")/.."

pgbin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
[ -n "$(pgbin)" ] || bash scripts/apt-install.sh test-postgres postgresql
BIN=$(pgbin)

# PostgreSQL refuses to run as root: run it as the postgres user when we are root.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
DIR=$(mktemp -d /tmp/tah-pg.XXXXXX)
chmod 755 "$DIR"
[ "$(id -u)" = 0 ] && chown postgres "$DIR"
PORT=$(( 20000 + RANDOM % 20000 ))
cleanup() { as_pg "$BIN/pg_ctl" -D "$DIR/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$DIR"; }
trap cleanup EXIT

as_pg "$BIN/initdb" -D "$DIR/data" -A trust -U tah >/dev/null
as_pg "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w \
  -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null
echo "test-postgres: PostgreSQL $("$BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT"

# Tests of the swarm's own behaviour, whose database work is bookkeeping every other server test also does,
# run once, on PGlite: the 3 × 2 training run (replicas.test.ts, 5 min), the 26-miner adversarial run
# (adversarial.test.ts, 4 min), churn, rebalancing, lying owners, CenteredClip, phases, mesh and pipeline
# (3.5 min together), and the NAT lab (nat.test.ts: its coordinator sits in a network namespace of its own, which cannot reach
# this server on the host's loopback). Every other server test (money, schemas, restarts, checkpoints' bytes, validator,
# hardening) runs again here. Pass a file to run only that one (e.g. server/src/replicas.test.ts).
SWARM_ONLY=(replicas adversarial churn rebalance liar centered-clip phases mesh pipeline nat)
# (scripts/vitest-run.sh: a file whose test worker died under it, and nothing else went wrong, runs once more.)
if [ $# -gt 0 ]; then TAH_TEST_DATABASE_URL="postgresql://tah@127.0.0.1:$PORT/postgres" bash scripts/vitest-run.sh "$@"
else TAH_TEST_DATABASE_URL="postgresql://tah@127.0.0.1:$PORT/postgres" bash scripts/vitest-run.sh server $(printf -- '--exclude server/src/%s.test.ts ' "${SWARM_ONLY[@]}"); fi
