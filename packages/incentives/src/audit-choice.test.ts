import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { auditCommitment, auditDraw, isAudited, verifyAuditChoice } from './audit-choice';

const miners = Array.from({ length: 200 }, () => randomBytes(32).toString('hex'));

describe('audit choice: committed before the round, revealed after', () => {
  it('cannot be predicted from the commitment: each secret picks its own miners, at the rate', () => {
    const a = randomBytes(32).toString('hex');
    const b = randomBytes(32).toString('hex');
    const chosenA = miners.filter((m) => isAudited(a, 1, 7, m, 0.25));
    const chosenB = miners.filter((m) => isAudited(b, 1, 7, m, 0.25));
    // Two secrets with public commitments choose different sets: the commitment alone tells a miner nothing.
    expect(chosenA).not.toEqual(chosenB);
    for (const n of [chosenA.length, chosenB.length]) expect(n).toBeGreaterThan(25), expect(n).toBeLessThan(80);
    // Another round or stage of the same secret is another draw.
    expect(miners.filter((m) => isAudited(a, 1, 8, m, 0.25))).not.toEqual(chosenA);
    expect(miners.filter((m) => isAudited(a, 2, 7, m, 0.25))).not.toEqual(chosenA);
    // Draws are uniform enough that the rate holds over many miners.
    const draws = miners.map((m) => auditDraw(a, 0, 1, m));
    expect(Math.min(...draws)).toBeGreaterThanOrEqual(0);
    expect(Math.max(...draws)).toBeLessThan(1);
  });

  it('is verifiable after the reveal, and a secret other than the committed one is refused', () => {
    const secret = randomBytes(32).toString('hex');
    const commitment = auditCommitment(secret);
    const chosen = verifyAuditChoice({ commitment, secret, stage: 0, round: 3, rate: 0.5, miners });
    expect(chosen).toEqual(miners.filter((m) => isAudited(secret, 0, 3, m, 0.5)));
    expect(() => verifyAuditChoice({ commitment, secret: randomBytes(32).toString('hex'), stage: 0, round: 3, rate: 0.5, miners })).toThrow(/does not match/);
    // Rate 1 audits everyone, rate 0 no one.
    expect(verifyAuditChoice({ commitment, secret, stage: 0, round: 3, rate: 1, miners })).toHaveLength(miners.length);
    expect(verifyAuditChoice({ commitment, secret, stage: 0, round: 3, rate: 0, miners })).toHaveLength(0);
  });
});
