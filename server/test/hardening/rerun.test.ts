import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateIdentity } from '@train-at-home/protocol';
import { register } from '@train-at-home/swarm';
import { afterEach, describe, expect, it, onTestFinished } from 'vitest';
import { testDatabase } from '@train-at-home/testkit/database';
import { hardeningHarness, stageMap } from '@train-at-home/testkit/hardening-harness';

/** Defect 7: a miner re-registering into another run was told ok and never appeared in its stage map. */
describe('a miner registering into another run', () => {
  const h = hardeningHarness();
  afterEach(() => h.close());

  it('appears in that run (the coordinator restarted under a new name on the same database)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tah-hardening-'));
    onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
    const database = await testDatabase(`hardening_runs_${Date.now()}`, dir);
    const identity = generateIdentity();
    let { app: first, url } = await h.start('run-a', database);
    await register(await h.open(url), identity, { backend: 'wasm', tokensPerSec: 1 });
    h.disconnectAll();
    await first.close();
    ({ app: first, url } = await h.start('run-b', database));
    const { minerId, runId } = await register(await h.open(url), identity, { backend: 'wasm', tokensPerSec: 1 });
    expect(runId).toBe(first.coordinator.runId);
    expect((await stageMap(first)).flat()).toContain(minerId);
  });
});
