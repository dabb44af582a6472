/**
 * npm run bench:merge — what a merge setting costs on the wire against what it costs in held-out loss (issue 45).
 *
 * In one process: R replicas of a whole model (every stage, the swarm's boundary codec between them: the local
 * trainer, which the swarm matches step for step), each on its own data stream, merging every H microbatches
 * the way the swarm does: per stage, pseudo-gradients anchor − weights, their mean through the merge's codec,
 * and DiLoCo's outer Nesterov step (IOTA_OUTER: lr 0.7, momentum 0.9) from the shared anchor. The transport is
 * left out (`bench:swarm` counts real bytes); what each replica would move in the butterfly is counted from the
 * codec's sizes: every partition of its contribution to each of its two owners, every partition's result from
 * both, 2(1 − 1/R) of a whole stage each way.
 *
 * Variants (name: merge every H, contribution codec, AdamW's moments at a merge):
 *   dense-H10       every 10, fp16 contributions and results: today's default (DEFAULT_MERGE)
 *   dense-H30       every 30
 *   topk8-H10       every 10, the 8 largest of each 256 values (int8), error feedback, sparse results
 *   topk32-H10      every 10, the 32 largest of each 256
 *   topk32-H30      every 30, the same
 *   topk32-noef-H10 every 10, top-32 without error feedback (what is not sent is lost)
 *   dense-H10-reset every 10, AdamW's moments restarted at each merge (no optimizer state crosses a round)
 *   topk32-H10-reset every 10, top-32 with error feedback, moments restarted
 *   topk32-sgd-H10  every 10, top-32 with error feedback and a plain outer step (lr 1, no momentum: SparseLoCo)
 *   topk8-sgd-H10   the same with the 8 largest
 * Held-out loss of the merged weights at the end, at equal tokens (K microbatches per replica).
 *
 *   npm run bench:merge                                     (tiny, K = 120, 1 seed)
 *   npm run bench:merge -- --microbatches 240 --seeds 3
 *   npm run bench:merge -- --variants dense-H10,topk32-sgd-H10 --name merge-sgd   (some variants, in a file of their own)
 */
import * as tf from '@tensorflow/tfjs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { AdamW, BatchSampler, LocalTrainer, PRESETS, countStageParameters, evaluationBatches } from '@train-at-home/model';
import { DATA_DIR, datasetName, initNodeBackend, loadDataset, prepareData } from '@train-at-home/model/node';
import { ErrorFeedback, IOTA_OUTER, type OuterSettings, OuterOptimizer, decodeSparse, decodeTopK, decodeValues, encodeSparse, encodeTopK, encodeValues, encodedBytes, readFlat, topKBytes, writeFlat } from '@train-at-home/swarm';
import { finish, machine } from './lib';

const { values } = parseArgs({
  options: {
    preset: { type: 'string', default: 'tiny' },
    microbatches: { type: 'string', default: '120' },
    seeds: { type: 'string', default: '1' },
    replicas: { type: 'string', default: '2' },
    variants: { type: 'string' },
    /** The result file's name (bench/results/<name>.json): a run of some variants beside the full one. */
    name: { type: 'string' },
  },
});
const preset = values.preset as 'tiny' | 'small';
const K = Number(values.microbatches);
const R = Number(values.replicas);
const config = PRESETS[preset];
const layout = preset === 'tiny' ? { stages: 3, bottleneck: 32, int8: true } : { stages: 3, bottleneck: 8, int8: true, codec: 'int8' as const };
const batchSize = 16;
const tokensPerMicrobatch = batchSize * config.contextLength;

type Variant = { name: string; every: number; codec: 'dense' | 'topk' | 'topk-noef'; top: number; resetAdam: boolean; outer?: OuterSettings };
const ALL: Variant[] = [
  { name: 'dense-H10', every: 10, codec: 'dense', top: 0, resetAdam: false },
  { name: 'dense-H30', every: 30, codec: 'dense', top: 0, resetAdam: false },
  { name: 'topk8-H10', every: 10, codec: 'topk', top: 8, resetAdam: false },
  { name: 'topk32-H10', every: 10, codec: 'topk', top: 32, resetAdam: false },
  { name: 'topk32-H30', every: 30, codec: 'topk', top: 32, resetAdam: false },
  { name: 'topk32-noef-H10', every: 10, codec: 'topk-noef', top: 32, resetAdam: false },
  { name: 'dense-H10-reset', every: 10, codec: 'dense', top: 0, resetAdam: true },
  { name: 'topk32-H10-reset', every: 10, codec: 'topk', top: 32, resetAdam: true },
  // SparseLoCo's reading: the error-feedback buffer already accumulates like a momentum, so the outer step is plain.
  { name: 'topk32-sgd-H10', every: 10, codec: 'topk', top: 32, resetAdam: false, outer: { lr: 1, momentum: 0 } },
  { name: 'topk8-sgd-H10', every: 10, codec: 'topk', top: 8, resetAdam: false, outer: { lr: 1, momentum: 0 } },
];
const chosen = values.variants ? values.variants.split(',').map((n) => ALL.find((v) => v.name === n) ?? (() => { throw new Error(`no variant ${n}: ${ALL.map((v) => v.name).join(', ')}`); })()) : ALL;
for (const v of chosen) if (K % v.every) throw new Error(`${K} microbatches is not a whole number of ${v.name}'s rounds of ${v.every}`);

const backend = await initNodeBackend();
prepareData({ outDir: DATA_DIR, vocabSize: config.vocabSize });
const data = loadDataset(join(DATA_DIR, datasetName(config.vocabSize)));
const evalBatches = evaluationBatches(data.heldOut, 16, config.contextLength, 8);

/** One replica's share of a merge round on one stage, in bytes each way (the butterfly's partitions, both owners). */
const butterfly = (bytes: number): number => 2 * (1 - 1 / R) * bytes;

async function run(v: Variant, seed: number): Promise<{ heldOut: number; mergeBytesPerToken: number[]; boundaryBytesPerToken: number }> {
  const trainers = Array.from({ length: R }, () => new LocalTrainer({ config, layout, seed, peakLr: preset === 'tiny' ? 0.006 : 0.003, warmupSteps: 10, totalSteps: K }));
  const samplers = Array.from({ length: R }, (_, r) => new BatchSampler(data.train, batchSize, config.contextLength, seed * 1000 + r));
  const stages = trainers[0]!.stages.length;
  const outer = await Promise.all(trainers[0]!.stages.map(async (s) => new OuterOptimizer(await readFlat(s))));
  const feedback = trainers.map((t) => t.stages.map((s) => new ErrorFeedback(countStageParameters(s.spec), v.top || 1)));
  const merged = new Array<number>(stages).fill(0);
  for (let done = 0; done < K; ) {
    for (let i = 0; i < v.every; i++, done++) for (let r = 0; r < R; r++) trainers[r]!.trainStep(samplers[r]!.next());
    for (let s = 0; s < stages; s++) {
      const mean = new Float32Array(outer[s]!.anchor.length);
      let up = 0;
      for (let r = 0; r < R; r++) {
        const pseudo = outer[s]!.pseudoGradient(await readFlat(trainers[r]!.stages[s]!));
        let sent: Float32Array;
        if (v.codec === 'dense') {
          sent = decodeValues(encodeValues(pseudo, 'fp16'), pseudo.length, 'fp16');
          up = encodedBytes(pseudo.length, 'fp16');
        } else if (v.codec === 'topk') {
          sent = feedback[r]![s]!.compress(pseudo).sent;
          up = topKBytes(pseudo.length, v.top);
        } else {
          sent = decodeTopK(encodeTopK(pseudo, v.top), pseudo.length, v.top);
          up = topKBytes(pseudo.length, v.top);
        }
        for (let i = 0; i < mean.length; i++) mean[i]! += sent[i]! / R;
      }
      let result: Float32Array;
      let down: number;
      if (v.codec === 'dense') {
        const bytes = encodeValues(mean, 'fp16');
        (result = decodeValues(bytes, mean.length, 'fp16')), (down = bytes.length);
      } else {
        const bytes = encodeSparse(mean);
        (result = decodeSparse(bytes, mean.length)), (down = bytes.length);
      }
      merged[s]! += butterfly(up) + butterfly(down);
      const anchor = outer[s]!.step(result, v.outer ?? IOTA_OUTER);
      for (const t of trainers) writeFlat(t.stages[s]!, anchor);
    }
    if (v.resetAdam) {
      for (const t of trainers) {
        t.optimizers.forEach((o, s) => {
          const { step } = o;
          o.dispose();
          t.optimizers[s] = new AdamW(t.stages[s]!.params, t.stages[s]!.specs);
          t.optimizers[s]!.step = step;
        });
      }
    }
  }
  const heldOut = trainers[0]!.evaluate(evalBatches);
  const tokens = K * tokensPerMicrobatch;
  const wire = trainers[0]!.wire;
  const boundaryBytesPerToken = (wire.forwardBytes + wire.backwardBytes) / wire.tokens / (stages - 1);
  for (const t of trainers) t.dispose();
  return { heldOut, mergeBytesPerToken: merged.map((b) => b / tokens), boundaryBytesPerToken };
}

const seeds = Array.from({ length: Number(values.seeds) }, (_, i) => i + 1);
const rows: Array<{ variant: string; every: number; codec: string; top: number; resetAdam: boolean; outer: OuterSettings; heldOut: number[]; meanHeldOut: number; mergeBytesPerToken: number[]; boundaryBytesPerToken: number; totalToBoundary: number }> = [];
for (const v of chosen) {
  const results = [];
  for (const seed of seeds) {
    const t0 = performance.now();
    const r = await run(v, seed);
    console.log(`${v.name} seed ${seed}: held-out ${r.heldOut.toFixed(4)}, merge ${r.mergeBytesPerToken.map((b) => b.toFixed(1)).join(' / ')} B per token by stage, boundaries ${r.boundaryBytesPerToken.toFixed(1)} (${((performance.now() - t0) / 1000).toFixed(0)} s)`);
    results.push(r);
  }
  const meanHeldOut = results.reduce((a, r) => a + r.heldOut, 0) / results.length;
  const merge = results[0]!.mergeBytesPerToken.map((b) => +b.toFixed(2));
  const boundary = results[0]!.boundaryBytesPerToken;
  // A miner's whole traffic against its boundary traffic, at the stage where merges weigh most (an end stage moves one boundary's bytes).
  const totalToBoundary = Math.max(...merge.map((m) => (m + boundary) / boundary));
  rows.push({ variant: v.name, every: v.every, codec: v.codec, top: v.top, outer: v.outer ?? IOTA_OUTER, resetAdam: v.resetAdam, heldOut: results.map((r) => +r.heldOut.toFixed(4)), meanHeldOut: +meanHeldOut.toFixed(4), mergeBytesPerToken: merge, boundaryBytesPerToken: +boundary.toFixed(2), totalToBoundary: +totalToBoundary.toFixed(2) });
}
const dense = rows.find((r) => r.variant === 'dense-H10');
for (const r of rows) console.log(`  ${r.variant.padEnd(16)} held-out ${r.meanHeldOut.toFixed(4)}${dense ? ` (${(((r.meanHeldOut / dense.meanHeldOut) - 1) * 100).toFixed(2)}% vs dense-H10)` : ''}, merge ${r.mergeBytesPerToken.join(' / ')} B per token, ${r.totalToBoundary}x the boundary bytes`);
const best = rows.filter((r) => !dense || r.meanHeldOut <= dense.meanHeldOut * 1.02).sort((a, b) => Math.max(...a.mergeBytesPerToken) - Math.max(...b.mergeBytesPerToken))[0];
tf.disposeVariables();
finish(values.name ?? (preset === 'tiny' ? 'merge' : `merge-${preset}`), {
  chosen: best?.variant,
  totalBytesPerToken: best ? +(Math.max(...best.mergeBytesPerToken) + best.boundaryBytesPerToken).toFixed(2) : undefined,
  activationBytesPerToken: best?.boundaryBytesPerToken,
  mergeBytesPerToken: best ? Math.max(...best.mergeBytesPerToken) : undefined,
  heldOutRatioToDense: best && dense ? +(best.meanHeldOut / dense.meanHeldOut).toFixed(4) : undefined,
  innerSteps: best?.every,
  variants: rows,
  budget: { preset, layout, batchSize, replicas: R, microbatchesPerReplica: K, seeds: seeds.length, note: `in one process; bytes from the codecs' sizes, the butterfly's 2(1 − 1/R) of a stage each way${seeds.length < 3 ? `; ${seeds.length} seed (the issue asks 3)` : ''}` },
  machine: machine(backend),
});
process.exit(0);
