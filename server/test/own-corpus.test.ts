import { bigramBaseline } from '@train-at-home/model';
import { initNodeBackend, loadDataset, prepareCorpus } from '@train-at-home/model/node';
import { httpTokenSource, type Miner } from '@train-at-home/swarm';
import { corpusDocuments } from '@train-at-home/testkit/corpus';
import { testDatabase } from '@train-at-home/testkit/database';
import { localMiner } from '@train-at-home/testkit/miner-processes';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';

/**
 * A run on an operator's own corpus (`prepare-data --input … --name`, served with `--data`): JSON lines written here,
 * prepared for `tiny`'s vocabulary under a data root of the test's own, and a coordinator whose run names that
 * dataset. Its files are served under /data/<name>/, registration tells miners its name, two in-process miners (two
 * stages, real WebRTC) fetch their tokens from the coordinator as tabs do and train past a merge, and the validator's
 * held-out loss is measured on that corpus's held-out split.
 */
const root = mkdtempSync(join(tmpdir(), 'tah-own-corpus-'));
let app: App;
let url: string;
let dataset: string;
const miners: Miner[] = [];

beforeAll(async () => {
  mkdirSync(join(root, 'in'));
  writeFileSync(join(root, 'in', 'notes.jsonl'), corpusDocuments(200, 300).map((text, id) => JSON.stringify({ id, text })).join('\n'));
  const prepared = await prepareCorpus({ inputs: [join(root, 'in')], name: 'notes', vocabSize: 320, outDir: join(root, 'data') });
  dataset = prepared.manifest.name;
  await initNodeBackend();
  app = await buildApp({
    database: await testDatabase(),
    dataRoot: join(root, 'data'),
    run: { name: 'own-corpus', preset: 'tiny', stages: 2, bottleneck: 32, dataset, training: { batchSize: 4 }, merge: { every: 3 }, incentives: { auditRate: 0, unprovenAuditRate: 0 } },
  });
  url = await app.fastify.listen({ port: 0, host: '127.0.0.1' });
});
afterAll(async () => {
  for (const m of miners) m.stop();
  await app?.close();
  rmSync(root, { recursive: true, force: true });
});

describe("a run on an operator's own corpus", () => {
  it('serves its dataset, tells miners its name, trains on it past a merge, and measures held-out loss on its held-out split', async () => {
    expect(dataset).toBe('notes-v1-bpe320');
    // Served as the shipped dataset is; nothing else under the data root.
    const manifest = await app.fastify.inject({ method: 'GET', url: `/data/${dataset}/manifest.json` });
    expect(manifest.statusCode).toBe(200);
    expect(manifest.json()).toMatchObject({ name: dataset, vocabSize: 320 });
    expect((await app.fastify.inject({ method: 'GET', url: `/data/${dataset}/../in/notes.jsonl` })).statusCode).toBe(404);
    expect((await app.fastify.inject({ method: 'GET', url: `/data/sotu-brown-v1-bpe320/manifest.json` })).statusCode).toBe(404);

    for (let i = 0; i < 2; i++) miners.push(localMiner(url, { tokens: httpTokenSource(url) }));
    for (const m of miners) await m.start();
    for (const m of miners) expect((m.registration as unknown as { layout: { dataset?: string } }).layout.dataset).toBe(dataset);
    // Both stages train and merge: the last stage checks each microbatch's targets against the run's data (this corpus).
    await expect.poll(async () => (await app.fastify.inject({ method: 'GET', url: '/api/merges' })).json().stages.map((s: { round: number }) => s.round), { timeout: 240_000, interval: 1000 }).toSatisfy((r: number[]) => r.every((n) => n >= 2));
    // Once every stage's checkpoint is in (uploaded after its round closed).
    await expect.poll(() => app.validator.evaluate(), { timeout: 120_000, interval: 2000 }).toBeDefined();
    const held = await app.validator.evaluate();
    // The validator's reference line is this corpus's bigram baseline: its held-out split, not the shipped one's.
    const ds = loadDataset(join(root, 'data', dataset));
    expect(held!.bigramLoss).toBeCloseTo(bigramBaseline(ds.train, ds.heldOut, 320).loss, 6);
    expect(Number.isFinite(held!.heldOutLoss)).toBe(true);
    // No microbatch was refused for tokens that are not the run's.
    expect(await app.db.query(`SELECT kind, reason FROM flags`)).toEqual([]);
  });
});
