import { describe, expect, it } from 'vitest';
import { simHarness } from './testing/sim-harness';
import { simMiners } from './testing/sim-miners';

const h = simHarness();

describe('liveness', () => {
  it('keeps heartbeats in memory and stores their times in one batched write; the silent sweep reads memory', async () => {
    const url = await h.start('liveness');
    const app = h.app!;
    const miners = h.miners;
    miners.push(...(await simMiners(url, 3)));
    const seen = async (): Promise<Map<string, number>> =>
      new Map((await app.db.query<{ id: string; at: Date | string }>('SELECT id, last_seen_at AS at FROM miners')).map((r) => [r.id, new Date(r.at).getTime()]));
    await app.coordinator.liveness.flush();
    const before = await seen();
    // Every statement the coordinator runs from here, as it runs it.
    const statements: string[] = [];
    const query = app.db.query.bind(app.db);
    app.db.query = ((sql: string, params?: unknown[]) => (statements.push(sql), query(sql, params))) as typeof app.db.query;

    await new Promise((r) => setTimeout(r, 20));
    for (let i = 0; i < 5; i++) for (const m of miners) expect(await m.heartbeat()).toBeGreaterThan(0);
    expect(statements.filter((s) => /UPDATE[\s\S]*last_seen_at/.test(s))).toEqual([]);
    expect(await seen()).toEqual(before);
    await app.coordinator.liveness.flush();
    expect(statements.filter((s) => /UPDATE[\s\S]*last_seen_at/.test(s))).toHaveLength(1);
    const after = await seen();
    for (const m of miners) expect(after.get(m.minerId)!).toBeGreaterThan(before.get(m.minerId)!);
    await app.coordinator.liveness.flush(); // nothing new heard: nothing written
    expect(statements.filter((s) => /UPDATE[\s\S]*last_seen_at/.test(s))).toHaveLength(1);

    // Silence is read from memory: one miner stops, the others keep beating; only it is dropped, with one write.
    const [quiet, ...alive] = miners;
    expect(await app.coordinator.dropSilent(60_000)).toEqual([]);
    await new Promise((r) => setTimeout(r, 300));
    for (const m of alive) await m.heartbeat();
    const dropped = new Promise((resolve) => quiet!.socket.once('disconnect', resolve));
    expect(await app.coordinator.dropSilent(250)).toEqual([quiet!.minerId]);
    await dropped;
    const rows = await app.db.query<{ id: string; status: string }>('SELECT id, status FROM miners ORDER BY id');
    expect(rows.filter((r) => r.status === 'dropped').map((r) => r.id)).toEqual([quiet!.minerId]);
    expect(rows.filter((r) => r.status === 'active').map((r) => r.id).sort()).toEqual(alive.map((m) => m.minerId).sort());
  });
});
