import { describe, expect, it } from 'vitest';
import type { AuditJob } from '../../src/jobs/audits';
import { nextJob, type ValidatorJob } from '../../src/validator/jobs';

const audit = (passed: number): ValidatorJob => ({ kind: 'audit', audit: { passed } as AuditJob });
const replay = { kind: 'replay' } as ValidatorJob;
const evaluate: ValidatorJob = { kind: 'evaluate', blobs: [] };

describe("the validator's queue", () => {
  it('runs scoring first, then audits of the least proven miners (first come among equals), then replays, then the rest', () => {
    expect(nextJob([evaluate, replay, audit(3), audit(0), audit(0), { kind: 'score' } as ValidatorJob])).toBe(5);
    expect(nextJob([evaluate, replay, audit(3), audit(0), audit(0)])).toBe(3);
    expect(nextJob([evaluate, replay, audit(3)])).toBe(2);
    expect(nextJob([evaluate, replay])).toBe(1);
    expect(nextJob([evaluate])).toBe(0);
    expect(nextJob([])).toBe(0);
  });
});
