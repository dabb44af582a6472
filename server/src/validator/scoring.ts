import { clasp, claspVerdicts, payoutTree, scoreMiners, splitEmission, type PathwayObservation, type VerdictOptions } from '@train-at-home/incentives';

/**
 * When CLASP alone flags a miner. Spot checks are the first line (exact, per
 * miner); CLASP judges from pathway losses, where a cheater not yet flagged
 * makes its partners' pathways worse too. In the adversarial run an honest
 * partner of unflagged cheaters reached z = 5.2 over 3 partners (0.8 nats),
 * so CLASP flags only a large, well-separated effect.
 */
export const CLASP_FLAGS: VerdictOptions = { minEffect: 0.1, minZ: 6, minObservations: 30, minPartners: 3 };

/** Everything the validator needs to score one emission epoch; the coordinator gathers it from the database. */
export interface ScoreJob {
  epoch: number;
  /** Base units, a decimal integer string. */
  emission: string;
  miners: Array<{
    minerId: string;
    account: string;
    stage: number | null;
    /** Verified microbatches of this epoch (see server/src/jobs/accounting.ts). */
    work: number;
    /** Flags standing against the miner (a flag stands for the rest of the run, whenever it was raised: Flags.standing). */
    flags: Array<{ kind: string; reason: string }>;
    /** Its spot checks over the window. */
    spotChecks: { passed: number; failed: number };
  }>;
  /** Loss reports of the window (CLASP's evidence), pathways through flagged miners already left out. */
  observations: PathwayObservation[];
}

export interface ScoreResult {
  scores: Array<{ minerId: string; account: string; stage: number | null; work: number; quality: number; score: number; flagged: boolean; breakdown: Record<string, unknown> }>;
  /** Miners CLASP found to raise the loss of the pathways through them: the coordinator flags them before settling. */
  newFlags: Array<{ minerId: string; kind: 'RAISES_LOSS'; reason: string; evidence: Record<string, unknown> }>;
  payouts: Array<{ account: string; amount: string; miners: string[]; proof: string[] }>;
  allocated: string;
  merkleRoot: string | null;
  residualStd: number;
}

/**
 * One epoch's scores and payouts (pure; runs in the validator process):
 * CLASP over the window's pathways gives each miner's effect on loss relative
 * to its stage peers; a significantly harmful miner is flagged; quality is
 * the lower of CLASP's and the spot checks' pass rate (zero when flagged);
 * score = verified work × quality; the emission is split in proportion, in
 * integer base units, with a Merkle proof per payout account.
 */
export function scoreEpoch(job: ScoreJob): ScoreResult {
  const result = job.observations.length > 0 ? clasp(job.observations) : { effects: [], residualStd: 0, observations: 0, rounds: 0 };
  const verdicts = new Map(claspVerdicts(result, CLASP_FLAGS).map((v) => [v.minerId, v]));
  const effects = new Map(result.effects.map((e) => [e.minerId, e]));
  const newFlags: ScoreResult['newFlags'] = [];
  for (const v of verdicts.values()) {
    if (!v.harmful) continue;
    const e = effects.get(v.minerId)!;
    newFlags.push({
      minerId: v.minerId,
      kind: 'RAISES_LOSS',
      reason: `pathways through this miner have ${e.effect.toFixed(3)} nats more loss than through its stage peers (z = ${v.z.toFixed(1)}, ${e.observations} microbatches, ${e.partners} partners)`,
      evidence: { effect: e.effect, stdError: e.stdError, share: e.share, z: v.z, observations: e.observations, partners: e.partners, epoch: job.epoch },
    });
  }
  const flaggedNow = new Map(newFlags.map((f) => [f.minerId, f]));
  const evidence = job.miners.map((m) => {
    const total = m.spotChecks.passed + m.spotChecks.failed;
    const flags = [...m.flags, ...(flaggedNow.has(m.minerId) ? [{ kind: 'RAISES_LOSS', reason: flaggedNow.get(m.minerId)!.reason }] : [])];
    return {
      minerId: m.minerId,
      account: m.account,
      stage: m.stage,
      work: m.work,
      claspQuality: verdicts.get(m.minerId)?.quality ?? 1,
      spotQuality: total > 0 ? m.spotChecks.passed / total : 1,
      flags,
    };
  });
  const byMiner = new Map(evidence.map((e) => [e.minerId, e]));
  const scores = scoreMiners(evidence).map((s) => {
    const e = byMiner.get(s.minerId)!;
    const effect = effects.get(s.minerId);
    return {
      ...s,
      breakdown: {
        claspQuality: e.claspQuality,
        spotQuality: e.spotQuality,
        spotChecks: job.miners.find((m) => m.minerId === s.minerId)!.spotChecks,
        ...(effect ? { effect: effect.effect, stdError: effect.stdError, share: effect.share, observations: effect.observations, partners: effect.partners } : {}),
        flags: e.flags,
      },
    };
  });
  const split = splitEmission(BigInt(job.emission), scores.map((s) => ({ account: s.account, score: s.score })));
  const tree = split.payouts.length > 0 ? payoutTree(split.payouts) : undefined;
  return {
    scores,
    newFlags,
    payouts: split.payouts.map((p) => ({
      account: p.account,
      amount: p.amount.toString(),
      miners: scores.filter((s) => s.account === p.account && s.score > 0).map((s) => s.minerId),
      proof: tree!.proofs[p.account]!,
    })),
    allocated: split.allocated.toString(),
    merkleRoot: tree?.root ?? null,
    residualStd: result.residualStd,
  };
}
