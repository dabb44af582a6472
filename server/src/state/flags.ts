import type { ActivationRegistry } from '../activations';
import type { MinerChannel, RunContext } from '../run-state';

/** What the flags use of the run: its state, its miners, the microbatches that exist, and re-staffing a stage a flagged miner left. */
export interface FlagHost extends RunContext, MinerChannel {
  readonly activations: Pick<ActivationRegistry, 'exists'>;
  rebalanceStages(): Promise<void>;
}

/** Every reason a miner can be flagged for; the same names in the database, the API and the miner's page. */
export type FlagKind =
  | 'OUTPUT_MISMATCH' // its forward output disagrees with the validator's replay
  | 'GRADIENT_MISMATCH' // the gradient it sent back disagrees with the replay
  | 'LOSS_MISREPORTED' // the last stage reported a loss other than the one it computed
  | 'RAISES_LOSS' // CLASP: pathways through it have significantly more loss than through its stage peers
  | 'PROBE_UNANSWERED' // it did not upload the payloads the validator asked for
  | 'FORGED_RECEIPTS' // it confirmed transfers of microbatches that never existed
  | 'AUDIT_FAILED' // a whole round of its, drawn for an audit, did not replay to what it sent and committed (jobs/audits.ts)
  | 'AUDIT_UNANSWERED' // it did not upload the record of a round drawn for an audit
  | 'COMMITMENT_MISMATCH'; // both owners of a partition refused its slice: not the contribution it committed to with merge-ready

/** Receipts for microbatches that never existed a miner may send before it is flagged (a restart's races stay below). */
export const MAX_FORGED_RECEIPTS = 3;

/**
 * Flags: evidence against a miner, each with a named kind, a sentence and the
 * evidence itself. A flagged miner's quality is zero, so it earns nothing;
 * it leaves the pipeline at once (status 'flagged': out of the stage map,
 * merges and assignment), is told why, and may not register again in this run.
 */
export class Flags {
  private readonly forged = new Map<string, string[]>();
  /** Refused receipts awaiting their recheck, by transfer: who confirmed it. */
  private readonly refused = new Map<string, Set<string>>();

  constructor(private readonly c: FlagHost) {}

  /** Records a flag once per miner and kind; returns whether it was new. */
  async raise(minerId: string, kind: FlagKind, reason: string, evidence: object): Promise<boolean> {
    const c = this.c;
    const fresh = await c.db.transaction(async (tx) => {
      const [exists] = await tx.query('SELECT 1 FROM flags WHERE run_id = $1 AND miner_id = $2 AND kind = $3', [c.runId, minerId, kind]);
      if (exists) return false;
      await tx.query('INSERT INTO flags (run_id, miner_id, kind, reason, evidence) VALUES ($1, $2, $3, $4, $5)', [c.runId, minerId, kind, reason.slice(0, 1000), JSON.stringify(evidence)]);
      await tx.query(`UPDATE miners SET status = 'flagged' WHERE id = $1 AND run_id = $2`, [minerId, c.runId]);
      return true;
    });
    if (!fresh) return false;
    c.log.warn({ minerId, kind, reason }, 'miner flagged');
    c.toMiner({ id: minerId, kind: 'flagged', flag: kind, reason });
    await c.rebalanceStages();
    return true;
  }

  /**
   * A receipt named a microbatch nobody had announced within the wait. It
   * counts against its reporter only if, `incentives.forgeryRecheckMs` later (30 s by default), the
   * microbatch is still unknown (under load an honest receiver's receipt can
   * outwait a stage-0 announcement that does come), the other end of the
   * transfer is still an active miner and never confirmed that transfer
   * itself: an honest pair that really moved a microbatch whose maker's
   * announcement was lost (it left, or its connection dropped) confirms it
   * from both ends, while a forger confirms transfers its peer never saw.
   * Each microbatch counts once per reporter. Refused receipts are never
   * stored, so a forgery that goes unflagged still earns nothing.
   */
  noteForgery(reporter: string, transfer: { activationId: string; direction: string; from: string; to: string }): void {
    const key = `${transfer.activationId}:${transfer.direction}:${transfer.from}:${transfer.to}`;
    const confirmedBy = this.refused.get(key) ?? new Set<string>();
    confirmedBy.add(reporter);
    this.refused.set(key, confirmedBy);
    const peer = transfer.from === reporter ? transfer.to : transfer.from;
    setTimeout(() => {
      void (async () => {
        const twoSided = confirmedBy.has(peer);
        this.refused.delete(key);
        if (twoSided || (await this.c.activations.exists(transfer.activationId, 0))) return;
        const [row] = await this.c.db.query<{ status: string }>('SELECT status FROM miners WHERE id = $1 AND run_id = $2', [peer, this.c.runId]);
        if (row?.status !== 'active') return;
        await this.countForgery(reporter, transfer.activationId);
      })().catch((e: unknown) => this.c.log.warn({ err: e }, 'forgery check failed'));
    }, this.c.run.incentives.forgeryRecheckMs).unref();
  }

  private async countForgery(minerId: string, activationId: string): Promise<void> {
    const ids = [...new Set([...(this.forged.get(minerId) ?? []), activationId])].slice(-10);
    this.forged.set(minerId, ids);
    if (ids.length >= MAX_FORGED_RECEIPTS) {
      await this.raise(minerId, 'FORGED_RECEIPTS', `confirmed transfers of ${ids.length} microbatches that no stage-0 miner ever sent, which their other ends never confirmed`, { activationIds: ids });
    }
  }

  /** Standing flags by miner (a flag stands for the rest of the run). */
  async standing(): Promise<Map<string, Array<{ kind: string; reason: string; createdAt: Date }>>> {
    const rows = await this.c.db.query<{ miner_id: string; kind: string; reason: string; created_at: Date }>(
      'SELECT miner_id, kind, reason, created_at FROM flags WHERE run_id = $1 ORDER BY id',
      [this.c.runId],
    );
    const out = new Map<string, Array<{ kind: string; reason: string; createdAt: Date }>>();
    for (const r of rows) out.set(r.miner_id, [...(out.get(r.miner_id) ?? []), { kind: r.kind, reason: r.reason, createdAt: r.created_at }]);
    return out;
  }
}
