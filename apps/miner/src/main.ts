/**
 * The headless Node miner.
 *   npm run miner -- --coordinator http://localhost:8080            one miner
 *   npm run miner -- --coordinator http://localhost:8080 --count 6  six miners, one process each
 *   … --payout-address <ss58> --payout-key-file <path>                  earnings go to a wallet
 *   … --backend webgpu                                                   on the GPU through Dawn (WASM when there is no adapter, saying why)
 * The key file holds the wallet's mnemonic or secret URI (never on the command
 * line); after registering, the miner links its earnings to the address, signed
 * by the wallet and by the miner (docs/rewards-api.md).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import wrtc from '@roamhq/wrtc';
import { DATA_DIR, datasetName, initNodeBackend, loadDataset, prepareData } from '@train-at-home/model/node';
import { cryptoReady, generateIdentity } from '@train-at-home/protocol';
import type { BackendName } from '@train-at-home/model';
import { httpTokenSource, isPermanentRefusal, linkPayout, Miner, MINER_EXIT_REFUSED, type BoundaryDeviceCodec } from '@train-at-home/swarm';
import { loadPayoutKey, PayoutKeyError, type PayoutKey } from './payout';

const { values } = parseArgs({
  options: {
    coordinator: { type: 'string', default: 'http://localhost:8080' },
    count: { type: 'string', default: '1' },
    microbatches: { type: 'string' },
    'in-flight': { type: 'string', default: '1' },
    'microbatch-timeout': { type: 'string', default: '30000' },
    'data-seed': { type: 'string' },
    'payout-address': { type: 'string' },
    'payout-key-file': { type: 'string' },
    backend: { type: 'string', default: 'wasm' },
  },
});
if (!['webgpu', 'wasm', 'cpu'].includes(values.backend!)) {
  console.error(`--backend is webgpu, wasm or cpu, not ${values.backend}`);
  process.exit(2);
}
const count = Number(values.count);
const payout = await payoutKey();

/** The wallet of --payout-address and --payout-key-file (both or neither), checked before anything starts. */
async function payoutKey(): Promise<PayoutKey | undefined> {
  const [address, file] = [values['payout-address'], values['payout-key-file']];
  if (address === undefined && file === undefined) return undefined;
  try {
    if (address === undefined || file === undefined) throw new PayoutKeyError('--payout-address and --payout-key-file go together');
    await cryptoReady();
    const key = loadPayoutKey(file, address);
    if (key.warning) console.warn(`warning: ${key.warning}`);
    return key;
  } catch (e) {
    if (!(e instanceof PayoutKeyError)) throw e;
    console.error(e.message);
    process.exit(2);
  }
}

if (count > 1) {
  // One process per miner: each trains on its own core's worth of time.
  const self = fileURLToPath(import.meta.url);
  const children: ChildProcess[] = [];
  const passOn = ['--coordinator', values.coordinator, '--backend', values.backend!, '--in-flight', values['in-flight'], '--microbatch-timeout', values['microbatch-timeout'], ...(values.microbatches ? ['--microbatches', values.microbatches] : [])];
  // The key file's path, never its contents: each child reads the file itself.
  if (payout) passOn.push('--payout-address', payout.address, '--payout-key-file', values['payout-key-file']!);
  for (let i = 0; i < count; i++) {
    children.push(spawn(process.execPath, [...process.execArgv, self, ...passOn, '--count', '1'], { stdio: 'inherit' }));
    await new Promise((r) => setTimeout(r, 300)); // registration order = stage order, for readable logs
  }
  const stopAll = (): void => children.forEach((c) => c.kill('SIGTERM'));
  process.once('SIGINT', stopAll);
  process.once('SIGTERM', stopAll);
  await Promise.all(children.map((c) => new Promise((r) => c.once('exit', r))));
} else {
  const backend = await initNodeBackend(values.backend as BackendName, (line) => console.log(`[miner] ${line}`));
  // On WebGPU, the boundary codec runs as the tab's WGSL kernels, once checked byte for byte against the JS codec.
  let deviceCodec: BoundaryDeviceCodec | undefined;
  if (backend === 'webgpu') {
    const gpu = await import('@train-at-home/model/webgpu');
    const check = await gpu.codecKernelCheck();
    console.log(`[miner] WGSL codec kernels ${check.ok ? 'agree with' : 'differ from'} the JS codec (${check.ms.toFixed(0)} ms)`);
    if (check.ok) deviceCodec = { encode: gpu.encodeBoundaryGPU, decode: gpu.decodeToTensorGPU };
    // The optimizer step as fused WGSL kernels, once checked against the WASM arithmetic.
    const opt = await gpu.useFusedOptimizer();
    console.log(`[miner] fused WGSL optimizer ${opt.ok ? 'agrees with' : 'differs from'} the WASM arithmetic (largest relative difference ${opt.maxRelativeDiff.toExponential(1)}): ${opt.ok ? 'in use' : 'not used'}`);
    // Layer norm and GELU as fused WGSL kernels, and matmuls reading transposed operands in place, each once checked against tfjs's composite, forward and backward.
    for (const [name, check] of [['layer norm', await gpu.useFusedLayerNorm()], ['GELU', await gpu.useFusedGelu()], ['matmuls without transposes', await gpu.useTransposedMatMul()], ['attention', await gpu.useFusedAttention()], ['residual add and layer norm', await gpu.useFusedAddLayerNorm()]] as const) {
      console.log(`[miner] fused WGSL ${name} ${check.ok ? 'agrees with' : 'differs from'} tfjs's composite (largest relative difference ${check.maxRelativeDiff.toExponential(1)}, ${check.worst}): ${check.ok ? 'in use' : 'not used'}`);
    }
    // No buffer created per step, fewer submits (model/webgpu/steady-state.ts).
    gpu.useSteadyStateWebGPU();
  }
  await cryptoReady();
  const identity = generateIdentity();
  const log = (line: string): void => console.log(`[miner ${identity.address.slice(0, 6)}] ${line}`);
  const miner = new Miner({
    coordinatorUrl: values.coordinator,
    identity,
    backend,
    tokensPerSec: 1000,
    wrtc,
    deviceCodec,
    maxInFlight: Number(values['in-flight']),
    microbatchTimeoutMs: Number(values['microbatch-timeout']),
    maxMicrobatches: values.microbatches ? Number(values.microbatches) : undefined,
    dataSeed: values['data-seed'] ? Number(values['data-seed']) : undefined,
    tokens: {
      async train(vocabSize, dataset, onBytes) {
        // The shipped corpora's dataset is prepared here (TAH_DATA_PREPARED: prepared elsewhere and carried, with no corpus
        // packages to check it against: scripts/device-swarm-bundle.sh). An operator's own corpus is read from ./data when
        // prepared on this machine too, else fetched from the coordinator as a tab does.
        if (dataset === datasetName(vocabSize)) {
          if (!process.env.TAH_DATA_PREPARED) prepareData({ outDir: DATA_DIR, vocabSize });
        } else if (!existsSync(join(DATA_DIR, dataset, 'manifest.json'))) return httpTokenSource(values.coordinator).train(vocabSize, dataset, onBytes);
        return loadDataset(join(DATA_DIR, dataset)).train;
      },
    },
    log,
  });
  const startedAt = performance.now();
  /**
   * How long a local miner whose coordinator process is gone waits for a restarted one: `npm start` builds the
   * app again before the coordinator listens, which a loaded machine takes well over a minute to do.
   */
  const ORPHAN_GRACE_MS = 180_000;
  // A local miner (forked by a coordinator for an empty stage, with an IPC channel) outlives its
  // coordinator's process only to be taken over by a restarted one (server/src/local-miners.ts): once
  // the channel is gone, it leaves when no coordinator has answered for ORPHAN_GRACE_MS, so none is
  // left running after the coordinator quits for good.
  if (process.send) {
    process.once('disconnect', () => {
      setInterval(() => {
        const lost = miner.status.coordinator;
        if (lost && lost.sinceMs > ORPHAN_GRACE_MS) {
          console.error(`[miner] no coordinator for ${Math.round(lost.sinceMs / 1000)} s since the one that started this local miner stopped: leaving`);
          miner.stop();
          process.exit(0);
        }
      }, 1000).unref();
    });
  }
  // The coordinator may not be up yet (or be restarting): say so plainly and try again.
  for (;;) {
    try {
      await miner.start();
      break;
    } catch (e) {
      miner.stop();
      if (isPermanentRefusal(e)) {
        console.error(`[miner] ${values.coordinator} refused this miner: ${e.message}`);
        process.exit(MINER_EXIT_REFUSED);
      }
      const err = e as Error & { description?: { message?: string } };
      console.error(`[miner] cannot register with ${values.coordinator}: ${err.description?.message ?? err.message}; trying again in 5 s`);
      await new Promise((r) => setTimeout(r, 5000));
    }
  }
  // Started by a coordinator that fills empty stages (server/src/local-miners.ts): it learns who this is.
  process.send?.({ registered: miner.registration!.minerId });
  if (payout) {
    // Linked once per start: the link is the coordinator's to keep, across reconnections.
    linkPayout(values.coordinator, identity, payout.address, payout.signRaw).then(
      (link) => log(`earnings go to ${link.address} (linked ${link.linkedAt})`),
      (e: unknown) => log(`payout link to ${payout.address} failed: ${(e as Error).message}`),
    );
  }
  const stop = (): void => {
    // One JSON line for operators and benchmarks: how this miner spent its time.
    const stats = miner.stats;
    console.log(
      JSON.stringify({
        minerStats: {
          stage: miner.registration?.stage,
          microbatches: stats?.microbatches ?? 0,
          computeMs: Math.round(stats?.computeMs ?? 0),
          wallMs: Math.round(performance.now() - startedAt),
          resubmitted: miner.resubmitted,
          // Loss reports and receipts the coordinator said it stored.
          stored: miner.reportsStored,
        },
      }),
    );
    miner.stop();
    process.exit(0);
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}
