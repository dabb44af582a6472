/**
 * Waits for a condition the way vitest's expect.poll does (the test kit imports no test runner):
 * calls `read` every `intervalMs` until `done` holds for its value, and throws an Error naming
 * `what` it waited for, with the last value or error seen, once `timeoutMs` have passed.
 */
export async function pollUntil<T>(
  what: string,
  read: () => T | Promise<T>,
  done: (value: T) => boolean,
  { timeoutMs = 60_000, intervalMs = 200 }: { timeoutMs?: number; intervalMs?: number } = {},
): Promise<T> {
  let last = 'no answer yet';
  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const loop = async (): Promise<T> => {
    for (;;) {
      try {
        const value = await read();
        if (done(value)) return value;
        last = `last value ${JSON.stringify(value)}`;
      } catch (e) {
        last = `last error ${e instanceof Error ? e.message : String(e)}`;
      }
      if (stopped) return undefined as never;
      await new Promise((resolve) => setTimeout(resolve, intervalMs));
    }
  };
  // A read that never settles still ends the wait at the deadline.
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what} (${last})`)), timeoutMs);
  });
  try {
    return await Promise.race([loop(), timeout]);
  } finally {
    stopped = true;
    clearTimeout(timer);
  }
}
