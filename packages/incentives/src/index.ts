/**
 * Incentives: from what the swarm observed to who gets paid, as pure
 * functions (no I/O, no tfjs) that run in the browser and Node.
 *
 * A payout, in files: pathway losses → clasp.ts (per-miner effects) →
 * clasp-verdict.ts (harmful? quality) → spot-check.ts (replays) → score.ts
 * (work × quality) → emission.ts (integer split) → merkle.ts (claim proofs).
 */

export * from './errors';
export * from './clasp';
export * from './clasp-verdict';
export * from './synthetic';
export * from './spot-check';
export * from './score';
export * from './emission';
export * from './merkle';
export * from './audit-choice';
