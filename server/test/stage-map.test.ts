import { afterEach, describe, expect, it } from 'vitest';
import { simHarness } from '@train-at-home/testkit/sim-harness';
import { countSentBytes, simMiner, simMiners, type SimMiner } from '@train-at-home/testkit/sim-miners';

const h = simHarness();
afterEach(() => h.close());

/**
 * The coordinator has published every one of these miners, and each one's view of each stage it talks to is
 * at the coordinator's last change of it (`exactly`: and names the same miners).
 */
function viewsAgree(all: SimMiner[], exactly = true): boolean {
  const published = h.app!.coordinator.stageFeed.view([...Array(h.app!.coordinator.run.stages).keys()]);
  const listed = new Set(published.flatMap((v) => v.miners));
  return all.every(
    (m) =>
      listed.has(m.minerId) &&
      [m.stage - 1, m.stage, m.stage + 1].every((s) => s < 0 || s >= published.length || (m.view.seq(s) === published[s]!.seq && (!exactly || m.view.peers(s).join() === published[s]!.miners.join()))),
  );
}

describe('the stage map miners are told', () => {
  it('tells a miner only about the stages it talks to, each change as one numbered delta; a miner that missed one fetches its stage again', async () => {
    const url = await h.start('stage-map-neighbourhood', 3);
    // One miner per stage (a newcomer goes to the least-staffed stage, the first of equals), then a fourth.
    const miners = h.miners;
    miners.push(...(await simMiners(url, 3, 1)));
    expect(miners.map((m) => m.stage)).toEqual([0, 1, 2]);
    await expect.poll(() => viewsAgree(miners)).toBe(true);
    const byStage = (s: number): SimMiner => miners.find((m) => m.stage === s)!;
    // The stage-0 miner knows stages 0 and 1, nothing of stage 2; the middle stage's knows all three.
    expect(byStage(0).view.peers(1)).toEqual([byStage(1).minerId]);
    expect(byStage(0).view.peers(2)).toEqual([]);
    expect(byStage(0).view.ids()).toEqual(new Set([0, 1].map((s) => byStage(s).minerId)));
    expect(byStage(1).view.ids()).toEqual(new Set([0, 1, 2].map((s) => byStage(s).minerId)));

    const deltas = new Map<number, Array<{ stage: number; seq: number; joined: string[]; left: string[] }>>();
    for (const m of miners) m.socket.on('stage-delta', (d) => deltas.set(m.stage, [...(deltas.get(m.stage) ?? []), d]));
    const fourth = await simMiner(url);
    miners.push(fourth);
    await expect.poll(() => viewsAgree(miners)).toBe(true);
    const s = fourth.stage;
    expect(s).toBe(0);
    // Its stage's neighbours (stages 0 and 1) got one delta naming it; stage 2's miner got nothing.
    for (let stage = 0; stage < 3; stage++) {
      if (Math.abs(stage - s) <= 1) expect(deltas.get(stage), `stage ${stage}`).toEqual([{ v: 1, stage: s, seq: 2, joined: [fourth.minerId], left: [] }]);
      else expect(deltas.get(stage), `stage ${stage}`).toBeUndefined();
    }
    expect(fourth.view.peers(s)).toEqual([byStage(s).minerId, fourth.minerId].sort());

    // A departure: the stage's neighbours drop it. A miner that misses that delta sees the next one skip a number and fetches the stage over REST.
    const watcher = byStage(1);
    watcher.socket.off('stage-delta');
    watcher.socket.once('stage-delta', () => watcher.socket.on('stage-delta', (d: unknown) => watcher.view.delta(d)));
    const leaver = byStage(s);
    leaver.close();
    miners.splice(miners.indexOf(leaver), 1);
    await expect.poll(() => h.app!.coordinator.stageFeed.view([s])[0]!.seq).toBe(3);
    expect(watcher.view.peers(s)).toContain(leaver.minerId); // missed
    const late = await simMiner(url); // the least-staffed stage: where the leaver was
    miners.push(late);
    expect(late.stage).toBe(s);
    await expect.poll(() => viewsAgree(miners)).toBe(true);
    expect(watcher.view.refetches).toBe(1);
    expect(watcher.view.peers(s)).toEqual([fourth.minerId, late.minerId].sort());

    // The REST fallback names what it serves, and refuses a malformed or out-of-range request by name.
    const rest = await (await fetch(`${url}/api/stage-map?stages=2,${s},2`)).json();
    expect(rest.stages).toEqual(h.app!.coordinator.stageFeed.view([2, s]));
    for (const bad of ['', 'x', '3', '0,,1', '-1', '01']) {
      const res = await fetch(`${url}/api/stage-map?stages=${bad}`);
      expect(res.status, bad).toBe(400);
      expect((await res.json()).error).toBe('BAD_REQUEST');
    }
    // The page's count of stages nobody holds comes from the same map.
    expect((await (await fetch(`${url}/api/status`)).json()).emptyStages).toEqual([]);
  });

  it('a join among N registered miners sends bytes that grow at most linearly in N (N = 100 and 1,000)', { timeout: 600_000 }, async () => {
    // A thousand simulated miners from one address: its connection cap and registrations budget raised, as bench:load raises them.
    const url = await h.start('stage-map-bytes', 3, { http: { maxConnectionsPerIp: 2100 }, socketRates: { 'register-per-address': { max: 10_000, perMs: 60_000 } } });
    const miners = h.miners;
    const joinCost = async (): Promise<{ n: number; bytes: number; packets: number }> => {
      await expect.poll(() => viewsAgree(miners, false), { timeout: 60_000 }).toBe(true);
      expect(viewsAgree(miners)).toBe(true);
      const n = miners.length;
      const counted = countSentBytes(h.app!.io);
      const newcomer = await simMiner(url);
      miners.push(newcomer);
      // Done when every miner that talks to its stage knows it (and it knows them).
      await expect.poll(() => viewsAgree(miners, false), { timeout: 60_000 }).toBe(true);
      expect(viewsAgree(miners)).toBe(true);
      expect(newcomer.view.peers(newcomer.stage)).toContain(newcomer.minerId);
      return { n, ...counted };
    };
    miners.push(...(await simMiners(url, 100)));
    const at100 = await joinCost();
    miners.push(...(await simMiners(url, 1000 - miners.length)));
    const at1000 = await joinCost();
    // Registered 50 at a time, they were spread evenly (assignment is one at a time, on PostgreSQL too).
    const sizes = h.app!.coordinator.stageFeed.view([0, 1, 2]).map((v) => v.miners.length);
    expect(Math.max(...sizes) - Math.min(...sizes), String(sizes)).toBeLessThanOrEqual(1);
    console.log(`bytes sent for one join: ${JSON.stringify({ at100, at1000 })}`);
    // The whole map to every miner (what this replaced) cost 67 MB per join at 1,000 miners.
    expect(at1000.bytes / at1000.n).toBeLessThan(500);
    expect(at1000.bytes / at100.bytes).toBeLessThanOrEqual(at1000.n / at100.n);
  });
});
