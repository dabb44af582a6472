import type { ChildProcess } from 'node:child_process';

/**
 * The first words of the error a test kit child's native crash throws. scripts/vitest-outcomes.ts knows them: a file
 * whose only failures carry them is run once more, like one whose test worker died (scripts/vitest-run.sh).
 */
export const NATIVE_CRASH = 'NATIVE_CRASH';

/**
 * Signals that mean the process crashed inside native code (@roamhq/wrtc's known crashes as peer connections close,
 * a V8 abort), not that someone stopped it: SIGTERM and SIGKILL are not among them (a test's stop, the OOM killer).
 */
const CRASH_SIGNALS = new Set<NodeJS.Signals>(['SIGSEGV', 'SIGBUS', 'SIGABRT', 'SIGILL', 'SIGFPE']);

/** Why `child` ended before `what`: a NATIVE_CRASH error for a crash signal, a plain one (with its code or signal) otherwise. */
export function exitedBefore(who: string, child: ChildProcess, what: string, code: number | null, signal: NodeJS.Signals | null): Error {
  const how = signal ? `signal ${signal}` : `code ${code}`;
  if (signal && CRASH_SIGNALS.has(signal)) return new Error(`${NATIVE_CRASH}: ${who} (pid ${child.pid}) died of ${how} before '${what}' (a crash in native code, not an assertion)`);
  return new Error(`${who} (pid ${child.pid}) exited with ${how} before '${what}'`);
}
