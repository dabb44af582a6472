#!/usr/bin/env bash
# Everything from Debian that any test starts, installed in one go before the first test (`npm test`'s setup
# phase): Chromium (browser tests), PostgreSQL (the server pass), Redis and haproxy (scale-out), coturn, nftables
# and iproute2 (the NAT lab and network namespaces), openssl (the HTTPS test's certificate). Each script that starts
# one still installs it when missing, for a single file run on its own; in the suite nothing is installed while
# tests run, since an install beside
# tests under way once outlasted their set-up (a fresh machine's CI run: scale-out waited 150 s for haproxy, the
# NAT lab's coturn came up mid-test).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
need() { command -v "$1" >/dev/null 2>&1 || [ -x "$1" ] || missing+=("$2"); }
need /usr/bin/chromium chromium
[ -n "$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null)" ] || missing+=(postgresql)
need redis-server redis-server
need haproxy haproxy
need turnserver coturn
need nft nftables
need ip iproute2
need openssl openssl
if [ ${#missing[@]} -eq 0 ]; then
  echo "test-deps: every package the tests need is installed"
  exit 0
fi
bash scripts/apt-install.sh test-deps "${missing[@]}"
