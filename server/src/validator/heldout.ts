import { join } from 'node:path';
import { LocalTrainer, PRESETS, bigramBaseline, evaluationBatches, importStageWeights, type TokenBatch } from '@train-at-home/model';
import { DATA_DIR, datasetName, initNodeBackend, loadDataset, prepareData } from '@train-at-home/model/node';
import type { Coordinator } from '../coordinator';
import { latestCheckpoint } from '../routes/checkpoints';

/**
 * The validator's view of the run: the latest checkpoint of every stage,
 * assembled into one model in this process, evaluated on the held-out split
 * through the same codec the miners use. Miners' own loss reports are never
 * taken for this figure.
 */
export class HeldOutEvaluator {
  private data?: { batches: TokenBatch[]; bigram: number };

  constructor(
    private readonly coordinator: Coordinator,
    private readonly evalBatches = 8,
  ) {}

  private async load(): Promise<{ batches: TokenBatch[]; bigram: number }> {
    if (this.data) return this.data;
    await initNodeBackend();
    const config = PRESETS[this.coordinator.run.preset];
    prepareData({ outDir: DATA_DIR, vocabSize: config.vocabSize });
    const ds = loadDataset(join(DATA_DIR, datasetName(config.vocabSize)));
    this.data = {
      batches: evaluationBatches(ds.heldOut, 32, config.contextLength, this.evalBatches),
      bigram: bigramBaseline(ds.train, ds.heldOut, config.vocabSize).loss,
    };
    return this.data;
  }

  /** Held-out loss of the latest checkpoints (of `rounds`, per stage), recorded as a metric; undefined while a stage has none. */
  async evaluate(): Promise<{ heldOutLoss: number; bigramLoss: number; rounds: number[] } | undefined> {
    const { batches, bigram } = await this.load();
    const run = this.coordinator.run;
    const blobs = await Promise.all(Array.from({ length: run.stages }, (_, s) => latestCheckpoint(this.coordinator, s)));
    if (blobs.some((b) => !b)) return undefined;
    const model = new LocalTrainer({ config: PRESETS[run.preset], layout: run, seed: run.seed, peakLr: 0, warmupSteps: 1, totalSteps: 1 });
    try {
      model.stages.forEach((stage, s) => importStageWeights(stage, blobs[s]!.data));
      const heldOutLoss = model.evaluate(batches);
      await this.coordinator.db.query(`INSERT INTO metrics (run_id, epoch, name, value) VALUES ($1, 0, 'heldout_loss', $2)`, [this.coordinator.runId, heldOutLoss]);
      return { heldOutLoss, bigramLoss: bigram, rounds: blobs.map((b) => b!.epoch) };
    } finally {
      model.dispose();
    }
  }
}
