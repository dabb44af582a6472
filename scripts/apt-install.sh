#!/usr/bin/env bash
# Installs Debian packages the tests need, when this user can (root with
# apt-get); otherwise says how, and fails.   bash scripts/apt-install.sh <who> <package>…
set -euo pipefail
who=$1
shift
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "$who: installing Debian's $*"
  # A mirror connection that stalls is dropped after 30 s and retried, not waited on for minutes (it once
  # outlasted the NAT test's 180 s set-up while the mirror was otherwise reachable). Another install under way
  # (two scripts at once) is waited for, not failed on.
  o=(-o Acquire::Retries=3 -o Acquire::http::Timeout=30 -o Acquire::https::Timeout=30 -o DPkg::Lock::Timeout=300)
  apt-get "${o[@]}" update -qq && DEBIAN_FRONTEND=noninteractive apt-get "${o[@]}" install -y -qq "$@" >/dev/null
else
  echo "$who: $* not installed and this user cannot install it (run as root, or: sudo apt-get install -y $*)" >&2
  exit 1
fi
