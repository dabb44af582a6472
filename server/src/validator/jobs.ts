import type { AuditJob } from './audits';
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
