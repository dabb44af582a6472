import type { AuditJob } from './compute';
import type { ReplayJob } from './compute';
import type { ScoreJob } from './scoring';

/** What the coordinator asks of its validator process (validator/process.ts). */
export type ValidatorJob =
  | { kind: 'evaluate'; blobs: Uint8Array[] }
  | { kind: 'generate'; blobs: Uint8Array[]; prompt: string; maxTokens: number; temperature?: number; seed?: number }
  | { kind: 'replay'; replay: ReplayJob }
  | { kind: 'audit'; audit: AuditJob }
  | { kind: 'score'; score: ScoreJob }
  | { kind: 'has'; stages: Array<{ stage: number; hash: string }> }
  | { kind: 'sleep'; ms: number };

/**
 * What catches cheaters and pays miners goes before held-out losses and samples: scoring first (an
 * epoch's settlement waits on it), then audits (settlement waits on those drawn before it was due),
 * those of miners with the fewest audits passed first (PROVEN_AUDITS, audits.ts), then spot-check
 * replays; the first come among equals. The index in `waiting` of the job to run next (0 when none).
 */
export function nextJob(waiting: ValidatorJob[]): number {
  const rank = (job: ValidatorJob): [number, number] =>
    job.kind === 'score' || job.kind === 'has' || job.kind === 'sleep' ? [0, 0] : job.kind === 'audit' ? [1, job.audit.passed ?? 0] : job.kind === 'replay' ? [2, 0] : [3, 0];
  let best = 0;
  let [x, y] = [Infinity, Infinity];
  waiting.forEach((job, i) => {
    const [a, b] = rank(job);
    if (a < x || (a === x && b < y)) [best, x, y] = [i, a, b];
  });
  return best;
}
