import * as tf from '@tensorflow/tfjs';
import type { Stage } from './stage';
import type { StageSpec } from './config';
import { paramSpecs } from './params';
import { contentHash, deserializeWeights, serializeWeights, WeightsError, type NamedTensor } from './weights';

/** A stage's weights as one blob, in its parameter order (async: GPU backends download). */
export async function exportStageWeights(stage: Stage): Promise<Uint8Array> {
  const tensors = await Promise.all(
    stage.specs.map(async (s) => ({ name: s.name, shape: s.shape, data: (await stage.params[s.name]!.data()) as Float32Array })),
  );
  return serializeWeights(tensors);
}

/** The same blob, read synchronously: a consistent snapshot between two optimizer steps. */
export function exportStageWeightsSync(stage: Stage): Uint8Array {
  return serializeWeights(stage.specs.map((s) => ({ name: s.name, shape: s.shape, data: stage.params[s.name]!.dataSync() as Float32Array })));
}

export function stageWeightsHash(bytes: Uint8Array): string {
  return contentHash(bytes);
}

/**
 * Loads a blob into a stage. Every name and shape is checked before anything
 * is assigned, so a blob for another stage or layout changes nothing.
 */
export function importStageWeights(stage: Stage, bytes: Uint8Array): void {
  const byName = checkStageWeights(bytes, stage.spec);
  for (const s of stage.specs) {
    const t = byName.get(s.name)!;
    tf.tidy(() => stage.params[s.name]!.assign(tf.tensor(t.data, t.shape)));
  }
}

/**
 * Checks a blob against a stage's parameter list (every name, every shape,
 * finite values) without touching any model; returns its tensors by name.
 */
export function checkStageWeights(bytes: Uint8Array, spec: StageSpec): Map<string, NamedTensor> {
  const specs = paramSpecs(spec);
  const tensors = deserializeWeights(bytes);
  const byName = new Map(tensors.map((t) => [t.name, t]));
  if (tensors.length !== specs.length || byName.size !== tensors.length) {
    throw new WeightsError(`blob holds ${tensors.length} tensors, stage ${spec.index} has ${specs.length}`);
  }
  for (const s of specs) {
    const t = byName.get(s.name);
    if (!t) throw new WeightsError(`blob lacks ${s.name} (is it another stage's?)`);
    if (t.shape.length !== s.shape.length || t.shape.some((d, i) => d !== s.shape[i])) {
      throw new WeightsError(`${s.name}: shape [${t.shape}] does not match [${s.shape}]`);
    }
  }
  return byName;
}
