import { IncentivesError } from '@train-at-home/incentives';

/** The code of the IncentivesError `f` throws (undefined if it throws none), for the incentives package's tests. */
export function errorCode(f: () => unknown): string | undefined {
  try {
    f();
  } catch (e) {
    if (e instanceof IncentivesError) return e.code;
    throw e;
  }
  return undefined;
}
