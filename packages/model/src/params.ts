import * as tf from '@tensorflow/tfjs';
import type { StageSpec } from './config';
import { hash32 } from './rng';

export interface ParamSpec {
  name: string;
  shape: number[];
  init: 'zeros' | 'ones' | { normal: number };
  /** AdamW decays matrices only, never gains or biases. */
  decay: boolean;
}

/**
 * The parameters a stage owns, in a fixed order. Names are global
 * (`h.3.attn.wqkv` is the same tensor whichever stage holds layer 3), so a
 * split model and the unsplit one initialise identically from one seed.
 */
export function paramSpecs(spec: StageSpec): ParamSpec[] {
  const { vocabSize: v, contextLength: t, dModel: d, nLayer } = spec.config;
  const b = spec.layout.bottleneck;
  const out: ParamSpec[] = [];
  const matrix = (name: string, shape: number[], std = 0.02): void => {
    out.push({ name, shape, init: { normal: std }, decay: true });
  };
  const norm = (name: string): void => {
    out.push({ name: `${name}.g`, shape: [d], init: 'ones', decay: false });
    out.push({ name: `${name}.b`, shape: [d], init: 'zeros', decay: false });
  };
  // GPT-2: residual projections scaled down by depth so the stream's variance does not grow.
  const residualStd = 0.02 / Math.sqrt(2 * nLayer);
  if (spec.isFirst) {
    matrix('wte', [v, d]);
    matrix('wpe', [t, d], 0.01);
  }
  if (spec.hasUp) matrix(`bneck.${spec.index - 1}.up`, [b, d]);
  for (let l = spec.firstLayer; l < spec.endLayer; l++) {
    norm(`h.${l}.ln1`);
    matrix(`h.${l}.attn.wqkv`, [d, 3 * d]);
    matrix(`h.${l}.attn.wo`, [d, d], residualStd);
    norm(`h.${l}.ln2`);
    matrix(`h.${l}.mlp.wfc`, [d, 4 * d]);
    matrix(`h.${l}.mlp.wproj`, [4 * d, d], residualStd);
  }
  if (spec.hasDown) {
    norm(`bneck.${spec.index}.down.ln`);
    matrix(`bneck.${spec.index}.down`, [d, b]);
  }
  if (spec.isLast) {
    norm('lnf');
    matrix('head', [d, v]);
  }
  return out;
}

export type Params = Record<string, tf.Tensor>;

/** Training arithmetic per parameter per token: 2 FLOPs in the forward, 4 in the backward (the usual 6·N·tokens). */
export const FLOPS_PER_PARAMETER_TOKEN = 6;

/** Achieved training arithmetic of a stage in TFLOP/s at a rate of tokens (its recomputed forward and attention's T² terms not counted). */
export function stageTflops(spec: StageSpec, tokensPerSec: number): number {
  return (FLOPS_PER_PARAMETER_TOKEN * countStageParameters(spec) * tokensPerSec) / 1e12;
}

/** How many values a stage's parameters hold (its weights blob is 4 bytes each, plus a header). */
export function countStageParameters(spec: StageSpec): number {
  return paramSpecs(spec).reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0);
}

/** Deterministic initial values: each tensor is seeded by (run seed, its name). */
export function initParams(spec: StageSpec, seed: number): Record<string, tf.Variable> {
  const out: Record<string, tf.Variable> = {};
  for (const p of paramSpecs(spec)) {
    const value = tf.tidy(() => {
      if (p.init === 'zeros') return tf.zeros(p.shape);
      if (p.init === 'ones') return tf.ones(p.shape);
      return tf.randomNormal(p.shape, 0, p.init.normal, 'float32', hash32(`${seed}:${p.name}`));
    });
    out[p.name] = tf.variable(value, true);
    value.dispose();
  }
  return out;
}
