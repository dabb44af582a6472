import wrtc from '@roamhq/wrtc';
import { BatchSampler, LocalTrainer, PRESETS, Stage, exportStageWeights, stageSpecs, stageWeightsHash, type RunLayout } from '@train-at-home/model';
import { DATA_DIR, datasetName, initNodeBackend, loadDataset, prepareData } from '@train-at-home/model/node';
import { generateIdentity, verifySignature } from '@train-at-home/protocol';
import { PeerMesh, PipelineWorker, StageMapView, coordinatorSignals, register, restStageMap } from '@train-at-home/swarm';
import { join } from 'node:path';
import { io as connect, type Socket } from 'socket.io-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';
import { testDatabase } from '@train-at-home/testkit/database';
import { NO_CHECKS } from '@train-at-home/testkit/coordinator';
import { SMALL_BOUNDARY } from '../src/run-config';

const config = PRESETS.tiny;
const schedule = { peakLr: 0.006, warmupSteps: 2, totalSteps: 4 };
const SEED = 11;
const BATCH = 4;

// The int8 boundary at a quarter width, and the default run's boundary (SMALL_BOUNDARY: narrower, a grouped low-bit deflated codec).
const layouts: Array<[string, RunLayout]> = [
  ['b=32, int8', { stages: 3, bottleneck: 32, int8: true }],
  [`the default run's boundary (b=${SMALL_BOUNDARY.bottleneck}, ${SMALL_BOUNDARY.codec})`, { stages: 3, ...SMALL_BOUNDARY }],
];

let app: App;
let layout: RunLayout;
const sockets: Socket[] = [];
const cleanups: Array<() => void> = [];

beforeAll(async () => {
  await initNodeBackend();
  prepareData({ outDir: DATA_DIR, vocabSize: config.vocabSize });
});
async function startRun(l: RunLayout): Promise<void> {
  layout = l;
  app = await buildApp({ database: await testDatabase(), run: { name: 'pipeline', preset: 'tiny', ...layout, incentives: NO_CHECKS } });
  await app.fastify.listen({ port: 0, host: '127.0.0.1' });
}
async function stopRun(): Promise<void> {
  cleanups.splice(0).forEach((c) => c());
  sockets.splice(0).forEach((s) => s.disconnect());
  await app.close();
}

interface Miner {
  id: string;
  stage: number;
  worker: PipelineWorker;
  model: Stage;
  mesh: PeerMesh;
  rejections: string[];
}

async function startMiner(url: string, losses: number[]): Promise<Miner> {
  const socket = connect(url, { transports: ['websocket'], reconnection: false, forceNew: true });
  sockets.push(socket);
  await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
  const stageMap = new StageMapView(restStageMap(url));
  socket.on('stages', (m: unknown) => stageMap.snapshot(m));
  socket.on('stage-delta', (d: unknown) => stageMap.delta(d));
  const identity = generateIdentity();
  const { minerId, stage } = await register(socket, identity, { backend: 'wasm', tokensPerSec: 100 });
  const mesh = new PeerMesh({
    selfId: minerId,
    wrtc,
    signals: coordinatorSignals(socket, identity, (from, signed, sig) => verifySignature('signal', signed, sig, `0x${from}`)),
  });
  const model = new Stage(stageSpecs(config, layout)[stage]!, SEED);
  const rejections: string[] = [];
  const worker = new PipelineWorker({
    selfId: minerId,
    stage: model,
    runId: app.coordinator.runId,
    mesh,
    nextPeers: () => stageMap.peers(stage + 1),
    epoch: () => 0,
    ...schedule,
    onLoss: (r) => losses.push(r.loss),
    onReject: (_from, reason) => rejections.push(reason),
  });
  cleanups.push(() => {
    worker.dispose();
    mesh.close();
    model.dispose();
  });
  return { id: minerId, stage, worker, model, mesh, rejections };
}

describe.each(layouts)('pipeline over the swarm, %s', (_name, runLayout) => {
  beforeAll(() => startRun(runLayout));
  afterAll(stopRun);
  it('trains the same weights as the local trainer, every activation and gradient crossing WebRTC', async () => {
    const url = `http://127.0.0.1:${(app.fastify.server.address() as { port: number }).port}`;
    const losses: number[] = [];
    const miners = [];
    for (let i = 0; i < 3; i++) miners.push(await startMiner(url, losses));
    expect(miners.map((m) => m.stage)).toEqual([0, 1, 2]);
    await new Promise((r) => setTimeout(r, 200)); // the last stage map reaches everyone

    const data = loadDataset(join(DATA_DIR, datasetName(config.vocabSize)));
    const batches = Array.from({ length: 4 }, ((s) => () => s.next())(new BatchSampler(data.train, BATCH, config.contextLength, 5)));
    for (const batch of batches) await miners[0]!.worker.submit(batch);

    const local = new LocalTrainer({ config, layout, seed: SEED, ...schedule });
    const localLosses = batches.map((b) => local.trainStep(b).loss);
    expect(losses).toHaveLength(4);
    losses.forEach((l, i) => expect(l).toBeCloseTo(localLosses[i]!, 5));
    for (const m of miners) {
      const swarm = stageWeightsHash(await exportStageWeights(m.model));
      const reference = stageWeightsHash(await exportStageWeights(local.stages[m.stage]!));
      expect(swarm, `stage ${m.stage}`).toBe(reference);
      expect(m.worker.stats.microbatches).toBe(4);
      expect(m.worker.stats.rejected).toBe(0);
    }
    local.dispose();
    expect(app.coordinator.relayed.frameBytes).toBe(0);

    // A peer that sends garbage, or a gradient nobody asked for, is refused by name and changes nothing.
    const [first, middle] = miners;
    const before = stageWeightsHash(await exportStageWeights(middle!.model));
    const id = new Uint8Array(16).fill(1);
    await first!.mesh.send(middle!.id, { kind: 'activation', runId: app.coordinator.runId, epoch: 0, activationId: id, pathway: [] }, new Uint8Array(100));
    await first!.mesh.send(middle!.id, { kind: 'gradient', runId: app.coordinator.runId, epoch: 0, activationId: id, pathway: [] }, new Uint8Array(100));
    await first!.mesh.send(middle!.id, { kind: 'activation', runId: 999, epoch: 0, activationId: id, pathway: [] }, new Uint8Array(100));
    await expect.poll(() => middle!.rejections.length).toBe(3);
    expect(middle!.rejections[0]).toMatch(/microbatch/);
    expect(middle!.rejections[1]).toMatch(/gradient for no activation/);
    expect(middle!.rejections[2]).toMatch(/run 999/);
    expect(stageWeightsHash(await exportStageWeights(middle!.model))).toBe(before);
    expect(middle!.worker.stats.microbatches).toBe(4);
  });
});
