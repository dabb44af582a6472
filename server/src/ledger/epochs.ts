/**
 * Emission epochs are periods of wall time counted from the run's start (its
 * `runs.created_at`): epoch e covers [runStart + e·epochMs, runStart + (e+1)·epochMs).
 * The validator settles each epoch once it has ended; the API shows the current one.
 * (Merge rounds are a different clock: the rows of the `epochs` table.)
 */

/** Epoch numbers are PostgreSQL integers: 0 … 2^31 − 1. */
export const MAX_EPOCH = 2 ** 31 - 1;

export interface EpochWindow {
  epoch: number;
  startsAt: Date;
  endsAt: Date;
}

function checkClock(runStartMs: number, epochMs: number): void {
  if (!Number.isSafeInteger(runStartMs)) throw new RangeError(`run start ${runStartMs} is not an integer of milliseconds`);
  if (!Number.isSafeInteger(epochMs) || epochMs <= 0) throw new RangeError(`epochMs ${epochMs} is not a positive integer`);
}

/** The wall-time window of one epoch. */
export function epochWindow(runStartMs: number, epochMs: number, epoch: number): EpochWindow {
  checkClock(runStartMs, epochMs);
  if (!Number.isInteger(epoch) || epoch < 0 || epoch > MAX_EPOCH) throw new RangeError(`epoch ${epoch} is not an integer in 0…${MAX_EPOCH}`);
  const startsMs = runStartMs + epoch * epochMs;
  return { epoch, startsAt: new Date(startsMs), endsAt: new Date(startsMs + epochMs) };
}

/**
 * The epoch that contains nowMs. A time before the run's start counts as epoch 0:
 * the database's clock (which set the start) and this process's may differ by a little.
 */
export function epochAt(runStartMs: number, epochMs: number, nowMs: number): number {
  checkClock(runStartMs, epochMs);
  if (!Number.isFinite(nowMs)) throw new RangeError(`time ${nowMs} is not finite`);
  return Math.min(MAX_EPOCH, Math.max(0, Math.floor((nowMs - runStartMs) / epochMs)));
}
