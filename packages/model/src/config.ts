import { parseCodec, type Precision } from './codec';

/** The transformer's shape. Plain data: it travels in run configuration and checkpoints. */
export interface ModelConfig {
  vocabSize: number;
  /** Tokens per sequence (T). */
  contextLength: number;
  nLayer: number;
  nHead: number;
  /** Residual width (d). */
  dModel: number;
}

/** How one run cuts the model: stages and the codec at each stage boundary. */
export interface RunLayout {
  /** Number of pipeline stages (S); blocks are split as evenly as possible. */
  stages: number;
  /** Width of the boundary tensor (b); b = d means no bottleneck projection. */
  bottleneck: number;
  /** Quantize boundary tensors (activations and their gradients) to int8 with per-row scales (when no `codec` is named). */
  int8: boolean;
  /** The boundary codec of both directions (codec.ts: 'fp32', 'int8', 'q<bits>g<group>[z]'); absent: int8 or fp32, as `int8` says. */
  codec?: Precision;
}

/** The codec a layout's boundaries use, both directions. */
export function boundaryCodec(layout: RunLayout): Precision {
  return layout.codec ?? (layout.int8 ? 'int8' : 'fp32');
}

export const PRESETS = {
  /** Trains in CI in seconds on one CPU core (WASM). */
  tiny: { vocabSize: 320, contextLength: 64, nLayer: 3, nHead: 4, dModel: 128 },
  /** The default run: about 6.9 M parameters. */
  small: { vocabSize: 4096, contextLength: 128, nLayer: 6, nHead: 8, dModel: 256 },
  /**
   * For the GPUs people lend (WebGPU): GPT-2 small's shape (d = 768, 12 layers
   * of 12 heads, context 256) with this project's 4096-token vocabulary,
   * about 91.5 M parameters. In 4 stages each holds ~23 M (92 MB of fp32
   * weights; with gradients and AdamW's moments ~370 MB), within a tab's GPU memory.
   */
  gpu: { vocabSize: 4096, contextLength: 256, nLayer: 12, nHead: 12, dModel: 768 },
} as const satisfies Record<string, ModelConfig>;

export type PresetName = keyof typeof PRESETS;

/**
 * Backends a preset's stages cannot be trained on. A `gpu` stage of 16
 * sequences aborts the WASM backend (XNNPACK, measured on the H100 machine
 * where Dawn found no Vulkan loader) and would take the pure-JS backend
 * minutes a step: such a miner would hold a stage and time out every
 * microbatch through it. The coordinator refuses its registration by name.
 */
export const UNSUITABLE_BACKENDS: Readonly<Partial<Record<PresetName, readonly string[]>>> = { gpu: ['wasm', 'cpu'] };

export class ConfigError extends Error {
  override name = 'ConfigError';
}

export function validateConfig(config: ModelConfig, layout: RunLayout): void {
  const ints = { ...config, stages: layout.stages, bottleneck: layout.bottleneck };
  for (const [k, v] of Object.entries(ints)) {
    if (!Number.isInteger(v) || v <= 0) throw new ConfigError(`${k} must be a positive integer, got ${String(v)}`);
  }
  if (config.dModel % config.nHead !== 0) throw new ConfigError(`dModel ${config.dModel} is not divisible by nHead ${config.nHead}`);
  if (layout.stages > config.nLayer) throw new ConfigError(`${layout.stages} stages need at least as many layers (${config.nLayer})`);
  if (layout.bottleneck > config.dModel) throw new ConfigError(`bottleneck ${layout.bottleneck} exceeds dModel ${config.dModel}`);
  if (layout.codec !== undefined) {
    try {
      parseCodec(layout.codec);
    } catch (e) {
      throw new ConfigError((e as Error).message);
    }
  }
}

/** What one stage holds: its blocks and whether it has the embedding, the head, and bottleneck ends. */
export interface StageSpec {
  index: number;
  stages: number;
  config: ModelConfig;
  layout: RunLayout;
  /** Transformer blocks [firstLayer, endLayer). */
  firstLayer: number;
  endLayer: number;
  isFirst: boolean;
  isLast: boolean;
  /** Width of what this stage receives (b), or 0 for token ids on the first stage. */
  inputWidth: number;
  /** Width of what this stage sends (b), or 0 for the loss on the last stage. */
  outputWidth: number;
  /** Projects b → d on entry (a bottleneck decoder). */
  hasUp: boolean;
  /** Projects d → b on exit (a bottleneck encoder). */
  hasDown: boolean;
}

export function stageSpecs(config: ModelConfig, layout: RunLayout): StageSpec[] {
  validateConfig(config, layout);
  const { stages } = layout;
  const narrow = layout.bottleneck < config.dModel;
  return Array.from({ length: stages }, (_, index) => {
    const isFirst = index === 0;
    const isLast = index === stages - 1;
    return {
      index,
      stages,
      config,
      layout,
      firstLayer: Math.floor((index * config.nLayer) / stages),
      endLayer: Math.floor(((index + 1) * config.nLayer) / stages),
      isFirst,
      isLast,
      inputWidth: isFirst ? 0 : layout.bottleneck,
      outputWidth: isLast ? 0 : layout.bottleneck,
      hasUp: !isFirst && narrow,
      hasDown: !isLast && narrow,
    };
  });
}

export function countParameters(config: ModelConfig): number {
  const { vocabSize: v, contextLength: t, nLayer: l, dModel: d } = config;
  return 2 * v * d + t * d + l * (12 * d * d + 4 * d) + 2 * d;
}
