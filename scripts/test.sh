#!/usr/bin/env bash
# `npm test`: every phase of the suite, each timed. The three test passes (embedded database, PostgreSQL server,
# browsers) all run even when an earlier phase failed, so one run shows every failure; the exit status is non-zero
# if any phase failed. The closing lines list each phase's time and outcome.
set -uo pipefail
cd "$(dirname "$0")/.."

summary=()
failed=0
failedPhases=()
# Each phase's output is kept (as well as printed) so that the closing lines can name every test that failed in any
# phase: CI keeps only the tail of the output, where only the last phase's own report would show.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
phase() {
  local name=$1
  shift
  echo
  echo "=== test phase: $name ($*)"
  local start=$SECONDS
  "$@" 2>&1 | tee "$logs/$name.log"
  local status=${PIPESTATUS[0]}
  local took=$((SECONDS - start))
  if [ "$status" -eq 0 ]; then summary+=("$(printf '  %-10s %5d s  passed' "$name" "$took")")
  else
    summary+=("$(printf '  %-10s %5d s  FAILED (exit %d)' "$name" "$took" "$status")")
    failed=1
    failedPhases+=("$name")
  fi
}

# Debian's packages (minutes of downloads and dpkg on a fresh machine) install beside the typecheck, the build and
# the data, which need none of them; no test starts before they are in (an install beside tests under way once
# outlasted their set-up).
echo
echo "=== test phase: setup (bash scripts/test-deps.sh, beside typecheck, build and data)"
setupStart=$SECONDS
bash scripts/test-deps.sh >"$logs/setup.log" 2>&1 &
setupPid=$!
# The typecheck, the build and the data are independent of each other: they run at once (about 20 s on two cores, where
# one after another took 37 s), each timed, each printed whole once all three are done.
quiet_phase() {
  local name=$1
  shift
  local start=$SECONDS
  "$@" >"$logs/$name.log" 2>&1
  local status=$?
  echo "$status $((SECONDS - start))" >"$logs/$name.status"
}
# A quiet phase's line in the summary, from what quiet_phase recorded; $2 says beside what it ran.
record_quiet() {
  local name=$1 beside=$2 status took
  read -r status took <"$logs/$name.status"
  if [ "$status" -eq 0 ]; then summary+=("$(printf '  %-10s %5d s  passed (beside %s)' "$name" "$took" "$beside")")
  else
    summary+=("$(printf '  %-10s %5d s  FAILED (exit %d)' "$name" "$took" "$status")")
    failed=1
    failedPhases+=("$name")
  fi
}
quiet_phase typecheck npm run --silent typecheck &
pids=($!)
quiet_phase build npm run --silent build &
pids+=($!)
quiet_phase data npm run --silent prepare-data &
pids+=($!)
wait "${pids[@]}"
for name in typecheck build data; do
  echo
  echo "=== test phase: $name"
  cat "$logs/$name.log"
  record_quiet "$name" 'the others of setup'
done
setupStatus=0
wait "$setupPid" || setupStatus=$?
echo
echo "=== test phase: setup (done)"
cat "$logs/setup.log"
if [ "$setupStatus" -eq 0 ]; then summary=("$(printf '  %-10s %5d s  passed (beside the next three)' setup $((SECONDS - setupStart)))" "${summary[@]}")
else
  summary=("$(printf '  %-10s %5d s  FAILED (exit %d)' setup $((SECONDS - setupStart)) "$setupStatus")" "${summary[@]}")
  failed=1
  failedPhases+=(setup)
fi
phase embedded bash scripts/vitest-run.sh --exclude server/test/scale-out.test.ts
# The PostgreSQL pass runs beside the browsers': each keeps the machine half idle alone (its files wait on
# epochs, takeovers and restarts: about 50% of two cores busy; the tabs about 80%), and one after the other they took
# 343 and 833 s of a fresh machine's CI run. Its output is kept and printed whole once the browsers are done.
echo
echo "=== test phase: postgres (bash scripts/test-postgres.sh, beside browsers; printed when done)"
quiet_phase postgres bash scripts/test-postgres.sh &
postgresPid=$!
phase browsers bash scripts/test-e2e.sh
wait "$postgresPid"
echo
echo "=== test phase: postgres (done)"
cat "$logs/postgres.log"
record_quiet postgres browsers

# What did not pass in each failed phase: the outcomes reporter's "not passed:" lines, then vitest's "FAIL file > test"
# lines, the errors' first lines and any miner swarm process that died before it was stopped (and of what).
for name in "${failedPhases[@]}"; do
  echo
  echo "did not pass in phase $name:"
  plain=$(sed -e 's/\x1b\[[0-9;]*m//g' "$logs/$name.log")
  { grep -E '^not passed: ' <<<"$plain"; grep -E '^ *(FAIL |(Assertion)?Error: |miner swarm: process )' <<<"$plain" | awk '!seen[$0]++' | head -30; } || true
done

echo
echo "test phases (${SECONDS} s in all):"
printf '%s\n' "${summary[@]}"
exit "$failed"
