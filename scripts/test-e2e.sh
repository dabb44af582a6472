#!/usr/bin/env bash
# The browser tests (e2e/): Debian's Chromium driven by playwright-core, in a
# network namespace of their own (scripts/in-netns.sh). Pass files to run only those.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-chromium.sh
[ -f dist/web/index.html ] || npm run build
bash scripts/in-netns.sh npx vitest run --config e2e/vitest.config.ts "$@"
