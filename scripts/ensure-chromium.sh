#!/usr/bin/env bash
# Makes sure Debian's Chromium is installed (the browser tests drive it with
# playwright-core; no browser is ever downloaded from anywhere else).
set -euo pipefail
[ -x /usr/bin/chromium ] || bash "$(dirname "$0")/apt-install.sh" ensure-chromium chromium
