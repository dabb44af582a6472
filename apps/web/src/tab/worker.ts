/**
 * The tab's miner, off the main thread. It probes the compute backends, then
 * runs the same Miner as the Node CLI (packages/swarm): registration,
 * pipeline worker, merges. Only three adapters differ from Node: the backend
 * (chosen by the probe), training tokens over HTTP, and the mesh, which is a
 * MeshPort to the page's PeerMesh (workers have no RTCPeerConnection).
 */
import * as tf from '@tensorflow/tfjs';
import { setWasmPaths } from '@tensorflow/tfjs-backend-wasm';
import '@tensorflow/tfjs-backend-webgpu';
import wasmPlain from '@tensorflow/tfjs-backend-wasm/dist/tfjs-backend-wasm.wasm?url';
import wasmSimd from '@tensorflow/tfjs-backend-wasm/dist/tfjs-backend-wasm-simd.wasm?url';
import wasmThreaded from '@tensorflow/tfjs-backend-wasm/dist/tfjs-backend-wasm-threaded-simd.wasm?url';
import { cryptoReady, generateIdentity, type Identity } from '@train-at-home/protocol';
import { installWasmBatchMatMul } from '@train-at-home/model';
import { Miner, MeshPort, httpTokenSource, runStageRound, type BoundaryDeviceCodec, type PortLike } from '@train-at-home/swarm';
import type { FromTabWorker, KernelCheck, ProbeOutcome, TabBackend, ToTabWorker } from './messages';
import { benchLocalTraining, benchStageSteps, stageLossCurve } from './bench';
import { probeBackends } from './probe';

setWasmPaths({ 'tfjs-backend-wasm.wasm': wasmPlain, 'tfjs-backend-wasm-simd.wasm': wasmSimd, 'tfjs-backend-wasm-threaded-simd.wasm': wasmThreaded });
// Batched products on the project's kernel, as in Node's miners and the validator (exact replays of WASM rounds).
installWasmBatchMatMul();

const scope = self as unknown as PortLike & { close(): void };
const post = (m: FromTabWorker): void => scope.postMessage(m);
const CANDIDATES: TabBackend[] = ['webgpu', 'webgl', 'wasm'];

let miner: Miner | undefined;
let identity: Identity | undefined;
let coordinatorUrl = '';
let backend: TabBackend | undefined;
let probe: ProbeOutcome | undefined;
let paused = false;
/** On WebGPU, the WGSL int8 codec kernels (once they agreed with the JS codec). */
let deviceCodec: BoundaryDeviceCodec | undefined;

function startMiner(): void {
  const m = new Miner({
    coordinatorUrl,
    identity: identity!,
    backend: backend!,
    // A rough speed for stage assignment: the probe's workload is about 0.2 GFLOP.
    tokensPerSec: Math.round(200_000 / (probe?.results.find((r) => r.backend === backend)?.ms ?? 100)),
    tokens: httpTokenSource(coordinatorUrl, (done, total) => m.setProgress(done < total ? { label: 'training data', done, total } : undefined)),
    createMesh: (options) => new MeshPort(scope, options),
    deviceCodec: backend === 'webgpu' ? deviceCodec : undefined,
    log: (line) => post({ ev: 'log', line }),
  });
  miner = m;
  m.start().catch((e: Error) => post({ ev: 'error', message: `could not join: ${e.message}` }));
}

/** A lost GPU device (driver reset, tab backgrounded too long): fall back to the next backend and carry on. */
function watchDevice(): void {
  if (backend !== 'webgpu') return;
  const device = (tf.backend() as unknown as { device?: { lost: Promise<{ message: string; reason?: string }> } }).device;
  void device?.lost.then(async (info) => {
    if (backend !== 'webgpu') return;
    miner?.stop();
    miner = undefined;
    tf.removeBackend('webgpu');
    let next = probe?.results.filter((r) => r.backend !== 'webgpu' && r.ms !== undefined).sort((a, b) => a.ms! - b.ms!)[0]?.backend;
    if (!next) {
      probe = await probeBackends(['webgl', 'wasm'], undefined, (b, done, total) => post({ ev: 'probing', backend: b, done, total }));
      post({ ev: 'probe', outcome: probe });
      next = probe.chosen;
    }
    await tf.setBackend(next);
    await tf.ready();
    backend = next;
    post({ ev: 'device-lost', message: `${info.reason ?? 'unknown'}: ${info.message || 'the GPU device was lost'}`, fallback: next });
    if (!paused) startMiner();
  });
}

/** On WebGPU: the WGSL int8 codec and the fused optimizer step, each used only once it agrees with the WASM arithmetic. */
async function installGpuKernels(): Promise<KernelCheck | undefined> {
  try {
    const gpu = await import('@train-at-home/model/webgpu');
    const codec = await gpu.codecKernelCheck();
    // The optimizer step as fused WGSL kernels, installed only when they agree with the WASM arithmetic.
    const optimizer = await gpu.useFusedOptimizer();
    // Layer norm and GELU as fused WGSL kernels, each installed only when it agrees with tfjs's composite, forward and backward.
    const layerNorm = await gpu.useFusedLayerNorm();
    const gelu = await gpu.useFusedGelu();
    // Matmuls that read transposed operands in place instead of launching transposes.
    const matMul = await gpu.useTransposedMatMul();
    // Causal self-attention as one launch forward and one backward (checked against tfjs's composite).
    const attention = await gpu.useFusedAttention();
    // Each residual add with the layer norm that reads its sum: 1 launch forward, 2 backward, the stream's gradient accumulated inside.
    const addLayerNorm = await gpu.useFusedAddLayerNorm();
    // No buffer created per step, fewer submits (model/webgpu/steady-state.ts).
    gpu.useSteadyStateWebGPU();
    const result = { ...codec, optimizer, layerNorm, gelu, matMul, attention, addLayerNorm };
    post({ ev: 'kernel-check', result });
    if (result.ok) deviceCodec = { encode: gpu.encodeBoundaryGPU, decode: gpu.decodeToTensorGPU };
    return result;
  } catch (e) {
    post({ ev: 'kernel-check', error: (e as Error).message });
    return undefined;
  }
}

async function start(m: Extract<ToTabWorker, { cmd: 'start' }>): Promise<void> {
  coordinatorUrl = m.coordinatorUrl;
  // The identity first: the Rewards page can link it to a wallet while the probe runs.
  await cryptoReady();
  const seed = Uint8Array.from(m.seed.match(/../g) ?? [], (h) => parseInt(h, 16));
  identity = generateIdentity(seed.length === 32 ? seed : undefined);
  post({ ev: 'identity', publicKey: identity.publicKey, address: identity.address });
  probe = await probeBackends(CANDIDATES, m.backend, (b, done, total) => post({ ev: 'probing', backend: b, done, total }));
  backend = probe.chosen;
  post({ ev: 'probe', outcome: probe });
  if (backend === 'webgpu') await installGpuKernels();
  watchDevice();
  startMiner();
}

scope.addEventListener('message', (event) => {
  const m = event.data as ToTabWorker;
  if (!m || typeof m !== 'object' || !('cmd' in m)) return;
  switch (m.cmd) {
    case 'start':
      start(m).catch((e: Error) => post({ ev: 'error', message: e.message }));
      break;
    case 'pause':
      paused = true;
      miner?.stop();
      break;
    case 'resume':
      if (paused && identity) {
        paused = false;
        startMiner();
      }
      break;
    case 'leave':
      miner?.stop();
      scope.close();
      break;
    case 'bench':
      probeBackends([], m.backend, () => {})
        .then(() => benchLocalTraining(m))
        .then((result) => post({ ev: 'bench', result }))
        .catch((e: Error) => post({ ev: 'bench', error: e.message }));
      break;
    case 'stage-round':
      // bench/backend-spread: one stage's round on the inputs given, as a tab on this backend computes it.
      probeBackends([], m.backend, () => {})
        .then(async () => {
          if (m.backend === 'webgpu') await installGpuKernels();
          return runStageRound(m.inputs, m.backend === 'webgpu' ? deviceCodec : undefined);
        })
        .then((result) => post({ ev: 'stage-round', result }))
        .catch((e: Error) => post({ ev: 'stage-round', error: e.message }));
      break;
    case 'stage-steps':
      // bench:webgpu-dispatch: a stage's microbatches as this tab computes them (its WGSL kernels installed), GPU calls counted.
      probeBackends([], m.backend, () => {})
        .then(async () => {
          const kernelCheck = m.backend === 'webgpu' ? await installGpuKernels() : undefined;
          return { ...(await benchStageSteps(m, m.backend === 'webgpu' ? deviceCodec : undefined)), ...(kernelCheck ? { kernelCheck } : {}) };
        })
        .then((result) => post({ ev: 'stage-steps', result }))
        .catch((e: Error) => post({ ev: 'stage-steps', error: e.message }));
      break;
    case 'fusion-curve':
      // e2e/webgpu.test.ts: a stage's loss curve on WebGPU with tfjs's composites, then with the tab's fused programs.
      probeBackends([], 'webgpu', () => {})
        .then(async () => {
          if (tf.getBackend() !== 'webgpu') throw new Error(`no WebGPU here (backend ${tf.getBackend()})`);
          const unfused = await stageLossCurve(m.options);
          const kernelCheck = await installGpuKernels();
          const fused = await stageLossCurve(m.options);
          const maxAbsDiff = Math.max(...unfused.map((l, i) => Math.abs(l - fused[i]!)));
          return { backend: tf.getBackend(), options: m.options, unfused, fused, maxAbsDiff, ...(kernelCheck ? { kernelCheck } : {}) };
        })
        .then((result) => post({ ev: 'fusion-curve', result }))
        .catch((e: Error) => post({ ev: 'fusion-curve', error: e.message }));
      break;
    case 'sign-payout-link':
      // The secret key never leaves this worker: the page gets the signature only.
      try {
        if (!identity) throw new Error('this tab has no miner identity yet: press Join on the Train page');
        post({ ev: 'payout-link-signed', requestId: m.requestId, signature: identity.sign('payout-link', { message: m.message }) });
      } catch (e) {
        post({ ev: 'payout-link-signed', requestId: m.requestId, error: (e as Error).message });
      }
      break;
    case 'lose-device':
      (tf.backend() as unknown as { device?: { destroy(): void } }).device?.destroy();
      break;
  }
});

setInterval(() => {
  if (!miner) return;
  const status = miner.status;
  post({ ev: 'status', status: { ...status, ...(paused ? { phase: 'idle', why: 'paused by you' } : {}), backend, paused } });
}, 500);
