#!/usr/bin/env bash
# Starts Debian's coturn (installed when missing) for tests and local runs, in
# the foreground, with the shared-secret scheme the coordinator mints
# credentials for (use-auth-secret): no config file, no CLI, no TLS unless
# TLS_CERT and TLS_KEY name a certificate and key (then turns: on TLS_PORT).
#   TURN_SECRET=... bash scripts/coturn.sh <listening ip> [port] [relay ports min-max]
# Run it beside the coordinator (see README.md, "TURN").
set -euo pipefail
here=$(dirname "$0")
command -v turnserver >/dev/null || bash "$here/apt-install.sh" coturn coturn
ip=${1:?the address to listen on and relay from}
port=${2:-3478}
relay=${3:-49160-49200}
: "${TURN_SECRET:?TURN_SECRET: the secret the coordinator mints credentials with}"
tls=(--no-tls --no-dtls)
if [ -n "${TLS_CERT:-}" ]; then tls=(--cert "$TLS_CERT" --pkey "${TLS_KEY:?TLS_KEY}" --tls-listening-port "${TLS_PORT:-443}" --no-dtls); fi
run=${TURN_RUN_DIR:-$(mktemp -d /tmp/coturn.XXXXXX)}
exec turnserver ${TURN_VERBOSE:-} ${TURN_EXTRA:-} -n --no-cli --simple-log --log-file stdout --fingerprint \
  --pidfile "$run/turnserver.pid" --userdb "$run/turndb" \
  --listening-ip "$ip" --relay-ip "$ip" --listening-port "$port" \
  --min-port "${relay%-*}" --max-port "${relay#*-}" \
  --use-auth-secret --static-auth-secret "$TURN_SECRET" --realm "${TURN_REALM:-train-at-home}" \
  --no-multicast-peers "${tls[@]}"
