import type { MinerStatus } from '@train-at-home/swarm';

/** The compute backends a tab can train on, fastest usually first. */
export type TabBackend = 'webgpu' | 'webgl' | 'wasm';

export interface ProbeResult {
  backend: TabBackend;
  /** Median milliseconds of the probe workload (absent when the backend did not initialise). */
  ms?: number;
  error?: string;
  /** WebGPU only: the adapter is a software one (SwiftShader, WARP). */
  fallbackAdapter?: boolean;
}

export interface ProbeOutcome {
  results: ProbeResult[];
  chosen: TabBackend;
  why: string;
}

export interface KernelCheck {
  rows: number;
  cols: number;
  scalesEqual: boolean;
  maxValueDiff: number;
  maxDequantDiff: number;
  /** Whole frames byte-identical to the JS codec's. */
  framesEqual: boolean;
  ok: boolean;
  ms: number;
  /** The fused WGSL optimizer step against the WASM arithmetic (in use only when ok). */
  optimizer?: { maxRelativeDiff: number; tolerance: number; ok: boolean; ms: number };
  /** The fused WGSL layer norm and GELU against tfjs's composites, forward and backward (each in use only when ok). */
  layerNorm?: FusedCheck;
  gelu?: FusedCheck;
  /** Matmuls reading transposed operands in place against the composite's explicit transposes (in use only when ok). */
  matMul?: FusedCheck;
  /** Causal self-attention in one launch forward and one backward against tfjs's composite (in use only when ok). */
  attention?: FusedCheck;
  /** A residual add and the layer norm of its sum in one kernel against tfjs's composite (in use only when ok). */
  addLayerNorm?: FusedCheck;
}

export interface FusedCheck {
  maxRelativeDiff: number;
  worst: string;
  tolerance: number;
  ok: boolean;
  ms: number;
}

/** Page → worker. */
export type ToTabWorker =
  | { cmd: 'start'; coordinatorUrl: string; seed: string; backend?: TabBackend }
  | { cmd: 'pause' }
  | { cmd: 'resume' }
  | { cmd: 'leave' }
  /** A drill: destroys the WebGPU device, as a driver reset would. */
  | { cmd: 'lose-device' }
  /** The Rewards page: sign a server-issued payout-link message with this tab's miner identity. */
  | { cmd: 'sign-payout-link'; requestId: number; message: string }
  /** bench/browser: the whole model in this worker on one backend, timed. */
  | { cmd: 'bench'; backend: TabBackend; preset: 'tiny' | 'small'; steps: number; batch: number }
  /** bench/backend-spread: one stage's round on given inputs, on one backend (audit/spread.ts). */
  | { cmd: 'stage-round'; backend: TabBackend; inputs: import('@train-at-home/swarm').StageRoundInputs }
  /** bench:webgpu-dispatch: a stage's microbatches on random inputs, with the GPU calls of each counted (WebGPU). */
  | { cmd: 'stage-steps'; backend: TabBackend; options: import('@train-at-home/swarm').SyntheticStageOptions; warmup: number; steps: number }
  | { cmd: 'fusion-curve'; options: import('./bench').LossCurveOptions };

export type TabStatus = MinerStatus & { backend?: TabBackend; paused: boolean };

/** Worker → page. */
export type FromTabWorker =
  | { ev: 'probing'; backend: TabBackend; done: number; total: number }
  | { ev: 'probe'; outcome: ProbeOutcome }
  /** The tab's miner identity, as soon as the worker has made it (before the probe). */
  | { ev: 'identity'; publicKey: string; address: string }
  | { ev: 'payout-link-signed'; requestId: number; signature?: string; error?: string }
  | { ev: 'status'; status: TabStatus }
  | { ev: 'kernel-check'; result?: KernelCheck; error?: string }
  | { ev: 'device-lost'; message: string; fallback: TabBackend }
  | { ev: 'log'; line: string }
  | { ev: 'bench'; result?: import('./bench').LocalBenchResult; error?: string }
  | { ev: 'stage-round'; result?: import('@train-at-home/swarm').StageRound; error?: string }
  | { ev: 'stage-steps'; result?: import('./bench').StageStepsResult; error?: string }
  | { ev: 'fusion-curve'; result?: import('./bench').FusionCurveResult; error?: string }
  | { ev: 'error'; message: string };
