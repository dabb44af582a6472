import { PRESETS, stageSpecs, type PresetName, type RunLayout } from '@train-at-home/model';

/** The run's layout: operator configuration, fixed for the life of a run. */
export interface RunConfig extends RunLayout {
  name: string;
  preset: PresetName;
  /** Seeds the initial weights: every replica of a stage starts from the same ones. */
  seed: number;
  /**
   * The prepared dataset it trains on, by folder name (`prepare-data --input … --name`, served with `--data`); unset:
   * the shipped corpora's (datasetName). Its vocabulary is the preset's.
   */
  dataset?: string;
  /** Every miner of the run uses these: microbatch size and the inner optimizer's schedule. */
  training: { batchSize: number; peakLr: number; warmupSteps: number; totalSteps: number };
  /** The stages' merges (the phase machine: training → merging → training). */
  merge: MergeSettings;
  /** Scoring and paying miners (the validator). */
  incentives: IncentiveSettings;
}

export interface IncentiveSettings {
  /** Wall time of one emission epoch; epoch e covers [run start + e·epochMs, run start + (e+1)·epochMs). */
  epochMs: number;
  /**
   * An epoch is settled this long after it ends: evidence about its work (spot checks, which
   * wait for the next merge's exact replays, and flags) keeps arriving after its end, and a
   * payout cannot be taken back.
   */
  settleAfterMs: number;
  /** Base units emitted per epoch, a decimal integer string (amounts are integers end to end). */
  emissionPerEpoch: string;
  /** Epochs of evidence (CLASP observations, spot checks, flags) behind each epoch's quality. */
  windowEpochs: number;
  /**
   * Earnings are held for a window: epoch e is settled only once the audits of every round through
   * epoch e + holdEpochs are done (and settleAfterMs has passed since that epoch ended). A miner whose
   * audit fails is flagged, and a flag zeroes every epoch not yet settled: a cheat caught in any round
   * of epochs e … e + holdEpochs forfeits epoch e with the rest of its window. In bench:audit
   * (bench/results/audit.json) most cheats passed the audit of their first round, one microbatch
   * computed honestly in the swarm's slow start, and were caught later: the window keeps that epoch unpaid.
   */
  holdEpochs: number;
  /** Share of completed microbatches the validator samples for replay (those some miner processed right after a merge are replayed). */
  spotCheckRate: number;
  /** A miner has this long to upload a payload the validator asked for. */
  probeTimeoutMs: number;
  /**
   * Share of (miner, round) pairs whose whole round the validator replays (jobs/audits.ts),
   * drawn after the round closed from a secret committed when it began. A failed or unanswered
   * audit flags the miner: it forfeits its whole window. With holdEpochs = H and r rounds an epoch,
   * a cheat does not pay while a round costs it less than auditRate·(H + 1)·r times what a round
   * earns (docs/ARCHITECTURE.md, "Audits"): 18 at 0.2, H = 2 and 30 rounds an hour.
   */
  auditRate: number;
  /**
   * The draw rate of a replica not yet proven (fewer than PROVEN_AUDITS audits passed of rounds with work in
   * them): new identities are the cheap ones (a flagged cheat comes back as one), so each is audited round after
   * round until it has shown honest work, whatever the validator's backlog. Never below auditRate; 0 audits off.
   */
  unprovenAuditRate?: number;
  /**
   * A miner has this long to find and encode an audited round's record, plus its upload at the miner's measured
   * rate (jobs/audits.ts, auditDeadlineMs): the audit's deadline.
   */
  auditTimeoutMs: number;
  /**
   * An answer after the deadline is still taken and replayed for this much longer: the hard bound. Only a miner that
   * has not answered by then is flagged AUDIT_UNANSWERED; meanwhile the epochs its round is in wait (their pay is
   * held). Unset: AUDIT_GRACE_MS.
   */
  auditGraceMs?: number;
  /** Pathway diversity for CLASP: each replica's downstream partner rotates at every merge of its stage. */
  rotatePathways: boolean;
  /** A receipt refused for an unknown microbatch is looked up again this much later before it counts as forged (state/flags.ts). */
  forgeryRecheckMs: number;
}

export interface MergeSettings {
  /** A stage merges once each of its replicas has H verified microbatches since the last merge… */
  every: number;
  /** …or once its training phase has lasted this long and some work was done. */
  maxTrainingMs: number;
  /** How the pseudo-gradient travels between replicas (packages/swarm/src/allreduce/values.ts). */
  precision: 'fp32' | 'fp16' | 'int8' | 'topk8' | 'topk32';
  /** How owners reduce a partition's contributions: CenteredClip by default (a poisoned contribution weighs at most τ). */
  reduction: 'mean' | 'centered-clip';
  /**
   * CenteredClip's radius relative to the stage peers: τ = clipScale × the median distance of a partition's
   * contributions from their coordinate-wise median, whatever the pseudo-gradients' scale (0: clipRadius instead).
   */
  clipScale: number;
  /** CenteredClip's radius τ (L2, per partition). */
  clipRadius: number;
  /** The outer Nesterov step (IOTA: 0.7 and 0.9). */
  outerLr: number;
  outerMomentum: number;
  /** Replicas have this long to pause and say they are ready; later ones sit the round out. */
  readyMs: number;
  /** The all-reduce's deadlines (sender, reducer, whole round). */
  senderMs: number;
  reducerMs: number;
  roundMs: number;
}

/** What an operator may set: any field, and any part of the training settings. */
export type RunOverrides = Partial<Omit<RunConfig, 'training' | 'merge' | 'incentives'>> & {
  training?: Partial<RunConfig['training']>;
  merge?: Partial<MergeSettings>;
  incentives?: Partial<IncentiveSettings>;
};

export const DEFAULT_INCENTIVES: IncentiveSettings = {
  epochMs: 3_600_000,
  settleAfterMs: 600_000,
  // 1 token of 10^9 base units per epoch (Bittensor's rao are 10^-9 TAO).
  emissionPerEpoch: '1000000000',
  windowEpochs: 3,
  // A window of three epochs: an epoch's earnings wait for the audits of the two after it.
  holdEpochs: 2,
  spotCheckRate: 0.25,
  probeTimeoutMs: 10_000,
  auditRate: 0.2,
  unprovenAuditRate: 1,
  auditTimeoutMs: 60_000,
  rotatePathways: true,
  forgeryRecheckMs: 30_000,
};

/**
 * Emission epochs of a run on one's own machine (`npm start`, local miners on): two minutes,
 * settled a minute after each ends once its own rounds' audits are done (no epochs held after it),
 * so a newcomer sees scores, a settled epoch and a claimable balance within the first few minutes
 * instead of hours. Hosted coordinators (`--local-miners 0`) keep DEFAULT_INCENTIVES, which hold
 * each epoch's earnings for its window's audits; a stored run keeps the settings it started with.
 * A new miner is drawn at the run's audit rate, not every round: the validator shares the machine with
 * the miners whose rounds it replays (a `small` round replayed in ~40 s on 2 cores beside three miners),
 * and every replay drawn from an epoch holds its settlement (with every round of the first miners drawn,
 * a newcomer's first epoch settled more than 6 minutes in).
 */
export const LOCAL_INCENTIVES: Pick<IncentiveSettings, 'epochMs' | 'settleAfterMs' | 'holdEpochs' | 'unprovenAuditRate'> = {
  epochMs: 120_000,
  settleAfterMs: 60_000,
  holdEpochs: 0,
  unprovenAuditRate: DEFAULT_INCENTIVES.auditRate,
};

/**
 * How often, at most, a local run's validator measures held-out loss and writes a sample (AppOptions.evaluateEveryMs;
 * EVALUATE_EVERY_MS, 30 s, elsewhere): each is a forward pass of 8 batches of 32 windows through every stage, on the
 * machine the tab and the local miners train on (bench/results/local-validator.json).
 */
export const LOCAL_EVALUATE_EVERY_MS = 120_000;

export const DEFAULT_MERGE: MergeSettings = {
  every: 10,
  maxTrainingMs: 120_000,
  precision: 'fp16',
  // CenteredClip with τ at twice the median distance (BTARD's robust reduction, its radius measured against the stage
  // peers): honest replicas' distances are alike and stay inside; a scaled or random contribution counts at most
  // τ, and its audit then flags it. With two replicas nobody is clipped (two cannot tell who is the outlier).
  reduction: 'centered-clip',
  clipScale: 2,
  clipRadius: 1,
  // Plain averaging of the replicas. IOTA's DiLoCo setting (lr 0.7, Nesterov 0.9) suits
  // merges hundreds of steps apart; at every = 10 on `tiny` it measured worse
  // (held-out 3.89 against 3.65 after 6 rounds of 3 stages × 2 replicas).
  outerLr: 1,
  outerMomentum: 0,
  readyMs: 5_000,
  senderMs: 10_000,
  reducerMs: 5_000,
  roundMs: 30_000,
};

/**
 * The `small` run's boundaries when the operator names none of bottleneck, int8
 * or codec: the compression frontier's choice (bench/results/compression.json,
 * `npm run bench:compression`), the most compression within a 2% held-out
 * penalty against the uncompressed control: an 8-wide bottleneck with int8
 * rows, 102x fewer bytes than fp32 at full width for +1.2% held-out loss. (The
 * grouped 4- and 6-bit codecs reach 186-326x but cost 3-5%.)
 */
export const SMALL_BOUNDARY: Pick<RunLayout, 'bottleneck' | 'int8' | 'codec'> = { bottleneck: 8, int8: true, codec: 'int8' };

export function defaultRunConfig(overrides: RunOverrides = {}): RunConfig {
  const preset = overrides.preset ?? 'small';
  const namesBoundary = overrides.bottleneck !== undefined || overrides.int8 !== undefined || overrides.codec !== undefined;
  const config: RunConfig = {
    name: 'default',
    preset,
    seed: 1,
    stages: 3,
    // Other presets: a quarter of the width, int8 (the frontier was measured on `small`'s width).
    ...(preset === 'small' && !namesBoundary ? SMALL_BOUNDARY : { bottleneck: PRESETS[preset].dModel / 4, int8: true }),
    ...overrides,
    training: {
      batchSize: preset === 'tiny' ? 32 : 16,
      peakLr: preset === 'tiny' ? 0.006 : 0.003,
      warmupSteps: 20,
      totalSteps: preset === 'tiny' ? 200 : 20_000,
      ...overrides.training,
    },
    merge: { ...DEFAULT_MERGE, ...overrides.merge },
    incentives: { ...DEFAULT_INCENTIVES, ...overrides.incentives },
  };
  stageSpecs(PRESETS[config.preset], config); // throws ConfigError on an impossible layout
  return config;
}
