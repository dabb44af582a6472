import type { App } from '@train-at-home/server/app';
import type { Evaluation } from '@train-at-home/server/jobs/index';

/**
 * A run's held-out evaluations as its validator records them (after each merged round when the app's
 * `validator.evaluateEveryMs` is 0), taken one at a time: a test that waits for the run to learn waits on these
 * instead of asking for evaluations of its own on a timer (each a forward pass of the whole model over the held-out
 * batches, on the machine the miners train on).
 */
export function evaluations(app: App): { next(timeoutMs: number): Promise<Evaluation | undefined>; stop(): void } {
  const queued: Evaluation[] = [];
  let wake: (() => void) | undefined;
  const stop = app.validator.onEvaluated((e) => {
    queued.push(e);
    wake?.();
  });
  return {
    /** The next evaluation not yet taken, or undefined if none came within timeoutMs. */
    async next(timeoutMs: number): Promise<Evaluation | undefined> {
      if (queued.length === 0) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, timeoutMs);
          wake = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        wake = undefined;
      }
      return queued.shift();
    },
    stop,
  };
}
