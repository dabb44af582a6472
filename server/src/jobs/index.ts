import type { Coordinator } from '../coordinator';
import { latestCheckpoint } from '../state/checkpoints';
import { Auditor } from './audits';
import { ValidatorProcess } from '../validator/client';
import { droppedOnClose } from '../validator/compute';
import { Settler } from './settlement';
import { SpotChecker } from './spot-checks';

/** The fixed prompt whose continuation shows what the model writes now. */
export const SAMPLE_PROMPT = 'The state of the Union is';
/** Tokens generated per sample. */
export const SAMPLE_TOKENS = 32;
/** Held-out loss and a sample after merged rounds at most this often (they wait behind replays anyway). */
export const EVALUATE_EVERY_MS = 30_000;

/**
 * The coordinator's validator: a separate process does the work (model
 * replays, held-out loss, samples, scoring: validator/process.ts); this side
 * hands it data from the database and stores what comes back. Three duties
 * run on the coordinator's tick, each never overlapping itself: spot checks,
 * the settlement of ended epochs, and after every merged round the held-out
 * loss of the assembled model with a sample of its text.
 */
/** A held-out loss of the assembled model, the same text's bigram baseline, and the merge round of each stage's checkpoint it was measured on. */
export interface Evaluation {
  heldOutLoss: number;
  bigramLoss: number;
  rounds: number[];
}

export class Validator {
  readonly process: ValidatorProcess;
  readonly spotChecks: SpotChecker;
  readonly settler: Settler;
  readonly audits: Auditor;
  /** Rounds whose audit draw is committed (stage:round), so the tick commits each once. */
  private readonly committed = new Set<string>();
  private evaluatedRound = 0;
  private evaluatedAt = 0;
  private busy = { checks: false, evaluation: false, audits: false };
  /** How often, at most, merged rounds get a held-out loss and a sample on their own (Infinity: only when asked, as a benchmark that evaluates on its own schedule does). */
  evaluateEveryMs = EVALUATE_EVERY_MS;
  /** Who hears each held-out evaluation as it is recorded (tests and benchmarks waiting on the run's learning). */
  private readonly evaluatedListeners = new Set<(e: Evaluation) => void>();

  constructor(
    private readonly c: Coordinator,
    dataRoot?: string,
  ) {
    this.process = new ValidatorProcess(c.run, c.log, dataRoot);
    this.spotChecks = new SpotChecker(c, this.process);
    this.settler = new Settler(c, this.process);
    this.audits = new Auditor(c, this.process);
    c.phases.onRoundClosed = async (stage, round, participants) => {
      this.committed.add(`${stage}:${round + 1}`);
      await this.audits.roundClosed(stage, round, participants);
    };
  }

  /** Calls `listener` with every held-out evaluation recorded from now on, until the returned function is called. */
  onEvaluated(listener: (e: Evaluation) => void): () => void {
    this.evaluatedListeners.add(listener);
    return () => void this.evaluatedListeners.delete(listener);
  }

  /** Held-out loss of the latest checkpoint of every stage, recorded as a metric; undefined while a stage has none. */
  async evaluate(): Promise<Evaluation | undefined> {
    const blobs = await Promise.all(Array.from({ length: this.c.run.stages }, (_, s) => latestCheckpoint(this.c, s)));
    if (blobs.some((b) => !b)) return undefined;
    const result = await this.process.request<{ heldOutLoss: number; bigramLoss: number }>({ kind: 'evaluate', blobs: blobs.map((b) => b!.data) });
    await this.c.db.query(`INSERT INTO metrics (run_id, epoch, name, value) VALUES ($1, 0, 'heldout_loss', $2)`, [this.c.runId, result.heldOutLoss]);
    // The bigram baseline of the same held-out text is the dashboard's reference line: stored once.
    await this.c.db.query(
      `INSERT INTO metrics (run_id, epoch, name, value) SELECT $1::int, 0, 'bigram_loss', $2::double precision WHERE NOT EXISTS (SELECT 1 FROM metrics WHERE run_id = $1 AND name = 'bigram_loss')`,
      [this.c.runId, result.bigramLoss],
    );
    const evaluation = { ...result, rounds: blobs.map((b) => b!.epoch) };
    for (const listener of this.evaluatedListeners) listener(evaluation);
    return evaluation;
  }

  /** A continuation of the fixed prompt by the latest checkpoints, stored with the held-out loss it was measured beside. */
  async sample(heldOutLoss?: number): Promise<{ text: string; rounds: number[] } | undefined> {
    const blobs = await Promise.all(Array.from({ length: this.c.run.stages }, (_, s) => latestCheckpoint(this.c, s)));
    if (blobs.some((b) => !b)) return undefined;
    const rounds = blobs.map((b) => b!.epoch);
    const { text } = await this.process.request<{ text: string }>({ kind: 'generate', blobs: blobs.map((b) => b!.data), prompt: SAMPLE_PROMPT, maxTokens: SAMPLE_TOKENS, seed: Math.min(...rounds) + 1 });
    await this.c.db.query('INSERT INTO samples (run_id, rounds, held_out_loss, prompt, text) VALUES ($1, $2, $3, $4, $5)', [
      this.c.runId,
      JSON.stringify(rounds),
      heldOutLoss ?? null,
      SAMPLE_PROMPT,
      text,
    ]);
    return { text, rounds };
  }

  /** Called every second by the app. */
  tick(): void {
    const guard = (key: keyof Validator['busy'], fn: () => Promise<void>): void => {
      if (this.busy[key]) return;
      this.busy[key] = true;
      fn()
        // A job the closing validator process dropped is no failure: the coordinator is stopping.
        .catch((e: unknown) => (this.closing || droppedOnClose(e) ? undefined : this.c.log.warn({ err: e }, `validator ${key} failed`)))
        .finally(() => (this.busy[key] = false));
    };
    guard('checks', () => this.spotChecks.tick());
    guard('audits', async () => {
      // Each stage's round in progress has its audit draw committed (the first, and after a restart).
      for (const { stage, round } of this.c.phases.status()) {
        if (this.committed.has(`${stage}:${round + 1}`)) continue;
        await this.audits.commit(stage, round + 1);
        this.committed.add(`${stage}:${round + 1}`);
      }
      await this.audits.tick();
    });
    void this.settler.tick();
    guard('evaluation', () => this.afterMerges());
  }

  /** After every stage has a checkpoint of a newer round: held-out loss and a text sample. */
  private async afterMerges(): Promise<void> {
    const rows = await this.c.db.query<{ round: number }>(`SELECT coalesce(min(r), 0)::int AS round FROM (SELECT max(epoch) AS r FROM checkpoints WHERE run_id = $1 GROUP BY stage HAVING count(*) > 0) t`, [this.c.runId]);
    const stagesWith = await this.c.db.query<{ n: number }>('SELECT count(DISTINCT stage)::int AS n FROM checkpoints WHERE run_id = $1', [this.c.runId]);
    const round = rows[0]?.round ?? 0;
    if ((stagesWith[0]?.n ?? 0) < this.c.run.stages || round <= this.evaluatedRound || Date.now() - this.evaluatedAt < this.evaluateEveryMs) return;
    this.evaluatedRound = round;
    this.evaluatedAt = Date.now();
    const evaluated = await this.evaluate();
    await this.sample(evaluated?.heldOutLoss);
  }

  private closing = false;

  close(): Promise<void> {
    this.closing = true;
    return this.process.close();
  }
}
