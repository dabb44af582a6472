#!/usr/bin/env bash
# `vitest run "$@"`, and once more for the files whose test worker died under them (vitest: "Worker exited
# unexpectedly"), when that is all that went wrong: no test failed, no other error. Such a death is a native crash
# (seen a few times in CI, from the WebRTC miners' swarm tests, @roamhq/wrtc's known crashes as peer connections
# close); it says nothing of the assertions, which then run whole in a fresh worker. So is a file whose only errors
# are a test kit child's native crash (NATIVE_CRASH, testkit/src/crash.ts: a miner process that died of SIGSEGV
# before it was ready). A test that fails, an error of any other kind, or a second death fails the run as before.
# scripts/vitest-outcomes.ts decides which files qualify and names every unpassed file as the run's last lines
# either way.
set -uo pipefail
cd "$(dirname "$0")/.."
list=$(mktemp /tmp/tah-vitest-crashed.XXXXXX)
trap 'rm -f "$list"' EXIT
TAH_VITEST_CRASHED="$list" npx vitest run "$@"
status=$?
[ "$status" -eq 0 ] && exit 0
mapfile -t files < <(grep -v '^$' "$list" 2>/dev/null)
[ "${#files[@]}" -gt 0 ] || exit "$status"
echo
echo "vitest-run: ${files[*]}: cut short by a native crash (its test worker, or a child of its test kit), no assertion failed: running that once more, in a fresh worker"
# The run's own options (a config, excludes) apply again; its file filters do not: only these files run.
opts=()
for a in "$@"; do case "$a" in -*) opts+=("$a") ;; *) [ "${#opts[@]}" -gt 0 ] && [[ "${opts[-1]}" == --exclude || "${opts[-1]}" == --config ]] && opts+=("$a") ;; esac; done
TAH_VITEST_CRASHED= npx vitest run "${opts[@]}" "${files[@]}"
