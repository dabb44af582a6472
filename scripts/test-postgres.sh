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

# What runs again here: every server test whose outcome can depend on the database server (money and claims under
# SERIALIZABLE, schemas and migrations, restarts, checkpoints' bytes, the validator, scale-out, the hardening files
# whose requests reach the database). Not again, and why:
# - the swarm's own behaviour, whose database work is bookkeeping every other server test also does: the 3 × 2
#   training run (replicas), the 26-miner adversarial run, the spot checks' detectors, audits on a slow line, a run on an operator's corpus, churn, rebalancing, lying owners, CenteredClip, phases, mesh
#   and pipeline, and the NAT lab (its coordinator sits in a network namespace of its own, which cannot reach this
#   server on the host's loopback);
# - files that never open a database of the test's (the import layers, run settings, the run store's Redis checks,
#   the validator's jobs and thresholds) or only the embedded one (idle memory, a start from another folder, the
#   coordinator's command line as an operator runs it, the embedded database's own maintenance);
# - requests refused before any query (body limits, odd socket messages, acknowledgements, other socket.io methods,
#   slow requests, rate limits: their stores are Redis or memory, never the database).
# Pass a file to run only that one (e.g. server/test/replicas.test.ts).
NOT_HERE=(
  replicas adversarial detectors audit-deadline own-corpus churn rebalance liar centered-clip phases mesh pipeline nat operator-cli
  imports run-config run-state validator/jobs validator/thresholds hardening/idle-memory hardening/working-directory
  db/maintenance hardening/body-limit hardening/messages hardening/socket-ack hardening/socket-methods hardening/slow-request hardening/rate-limits
)
# (scripts/vitest-run.sh: a file whose test worker died under it, and nothing else went wrong, runs once more.)
if [ $# -gt 0 ]; then TAH_TEST_DATABASE_URL="postgresql://tah@127.0.0.1:$PORT/postgres" bash scripts/vitest-run.sh "$@"
else
  # The files, named one by one (vitest's --exclude does not reach a project that has excludes of its own).
  mapfile -t files < <(find server/test -name '*.test.ts' | sort | while read -r f; do
    name=${f#server/test/}; name=${name%.test.ts}
    [[ " ${NOT_HERE[*]} " == *" $name "* ]] || echo "$f"
  done)
  TAH_TEST_DATABASE_URL="postgresql://tah@127.0.0.1:$PORT/postgres" bash scripts/vitest-run.sh "${files[@]}"
fi
