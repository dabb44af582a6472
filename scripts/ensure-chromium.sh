#!/usr/bin/env bash
# Makes sure Debian's Chromium is installed (the browser tests drive it with
# playwright-core; no browser is ever downloaded from anywhere else).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "ensure-chromium: installing Debian's chromium"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "ensure-chromium: the browser tests need Chromium at /usr/bin/chromium; run as root or: sudo apt-get install -y chromium" >&2
  exit 1
fi
