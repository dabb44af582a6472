/**
 * Scale-out mode (scale-out.ts): two coordinator processes (the real command
 * line, `main.ts`) serving one run, with one PostgreSQL database and a real
 * Redis (scripts/redis.sh) between them. Runs in the PostgreSQL pass
 * (scripts/test-postgres.sh), which gives it the server.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PROTOCOL_VERSION, cryptoReady } from '@train-at-home/protocol';
import { testDatabase } from './db/test-database';
import { simMiner, type SimMiner } from './testing/sim-miners';

const MAIN = fileURLToPath(new URL('./main.ts', import.meta.url));
const REDIS_SH = fileURLToPath(new URL('../../scripts/redis.sh', import.meta.url));
const TSX = pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href;

const children: ChildProcess[] = [];
const miners: SimMiner[] = [];

async function until<T>(what: string, fn: () => Promise<T | undefined | false> | T | undefined | false, timeoutMs: number): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** A coordinator process in scale-out mode; its output is kept for a failure's message. */
function coordinator(port: number, env: Record<string, string>): { child: ChildProcess; url: string; output: () => string } {
  const child = spawn(process.execPath, ['--import', TSX, MAIN, '--port', String(port), '--host', '127.0.0.1', '--preset', 'tiny', '--stages', '3', '--local-miners', '0', '--run', 'scale-out'], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  let out = '';
  child.stdout!.on('data', (c: Buffer) => (out = (out + c.toString()).slice(-20_000)));
  child.stderr!.on('data', (c: Buffer) => (out = (out + c.toString()).slice(-20_000)));
  return { child, url: `http://127.0.0.1:${port}`, output: () => out };
}

async function status(url: string): Promise<{ activeMiners: number; scaleOut: { singletonJobs: boolean } | null } | undefined> {
  try {
    const r = await fetch(`${url}/api/status`);
    return r.ok ? ((await r.json()) as { activeMiners: number; scaleOut: { singletonJobs: boolean } | null }) : undefined;
  } catch {
    return undefined;
  }
}

/** The next signal a miner receives, from `from`. */
function nextSignal(m: SimMiner, from: string): Promise<{ from: string; payload: string }> {
  return new Promise((resolve) => {
    const on = (s: { from: string; payload: string }): void => {
      if (s.from !== from) return;
      m.socket.off('signal', on);
      resolve(s);
    };
    m.socket.on('signal', on);
  });
}

function sendSignal(from: SimMiner, to: SimMiner, seq: number, payload: string): Promise<{ ok: boolean }> {
  const signed = { to: to.minerId, kind: 'candidate' as const, payload, seq };
  return new Promise((resolve) => from.socket.emit('signal', { v: PROTOCOL_VERSION, ...signed, signature: from.identity.sign('signal', signed) }, resolve));
}

const holds = (m: SimMiner, stage: number, id: string): boolean => m.view.peers(stage).includes(id);

/** Registers a miner and keeps it heartbeating as the client does (a miner that stops is dropped) until it closes. */
async function joined(url: string, identity?: SimMiner['identity']): Promise<SimMiner> {
  const m = await simMiner(url, identity);
  miners.push(m);
  void (async () => {
    while (m.socket.connected) {
      await m.heartbeat();
      await new Promise((r) => setTimeout(r, m.heartbeatMs));
    }
  })();
  return m;
}

// Runs in the PostgreSQL pass only (package.json's test leaves it out of the embedded database's pass).
if (!process.env.TAH_TEST_DATABASE_URL) throw new Error('scale-out.test.ts needs a PostgreSQL server: run it with bash scripts/test-postgres.sh server/src/scale-out.test.ts');

describe('scale-out: two coordinator processes, one PostgreSQL, Redis', () => {
  let redis: ChildProcess;
  let env: Record<string, string>;
  const port = 20000 + Math.floor(Math.random() * 20000);

  beforeAll(async () => {
    await cryptoReady();
    const redisPort = port + 1;
    redis = spawn('bash', [REDIS_SH, String(redisPort)], { stdio: 'inherit', detached: true });
    const probe = new Redis(`redis://127.0.0.1:${redisPort}`, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on('error', () => {}); // refused until it listens: the wait below tries again
    // Installed first where missing (scripts/apt-install.sh): up to a couple of minutes.
    await until('Redis', () => probe.connect().then(() => probe.ping(), () => undefined), 150_000);
    probe.disconnect();
    const db = await testDatabase(`scale_out_${Date.now()}`);
    env = { DATABASE_URL: db.url!, REDIS_URL: `redis://127.0.0.1:${redisPort}`, TAH_DOMAIN: 'localhost' };
  }, 180_000);

  afterAll(async () => {
    for (const m of miners) m.close();
    for (const c of children) c.kill('SIGKILL');
    if (redis?.pid) process.kill(-redis.pid, 'SIGTERM');
  });

  it('serves one run from both; one runs the singleton jobs; when it is killed the other takes over and its miners come back', { timeout: 300_000 }, async () => {
    const a = coordinator(port + 2, env);
    await until('coordinator A to hold the jobs lease', async () => (await status(a.url))?.scaleOut?.singletonJobs, 60_000).catch((e: Error) => {
      throw new Error(`${e.message}\n${a.output()}`);
    });
    const b = coordinator(port + 3, env);
    const bStatus = await until('coordinator B', () => status(b.url), 60_000).catch((e: Error) => {
      throw new Error(`${e.message}\n${b.output()}`);
    });
    // Exactly one process runs the validator, settlement, local miners and the stage map's publisher.
    expect(bStatus.scaleOut).toEqual({ singletonJobs: false });
    expect((await status(a.url))?.scaleOut).toEqual({ singletonJobs: true });

    // Miners on both: assignment is one run's (the advisory lock spans processes), so three newcomers take three stages.
    const m0 = await joined(a.url);
    const m1 = await joined(b.url);
    const m2 = await joined(a.url);
    expect([m0.stage, m1.stage, m2.stage]).toEqual([0, 1, 2]);
    const [s0, s1, s2] = [m0, m1, m2];

    // The stage map crosses processes: the miner of stage 1 hears of the joins on both, with one numbering.
    await until('the stage-1 miner to see stages 0 and 2 held', () => holds(s1, 0, s0.minerId) && holds(s1, 2, s2.minerId), 20_000);
    await until('the stage-0 miner to see stage 1 held', () => holds(s0, 1, s1.minerId), 20_000);
    expect((await status(a.url))?.activeMiners).toBe(3);
    expect((await status(b.url))?.activeMiners).toBe(3);

    // Signaling between miners on different processes, both ways.
    const onB = m1;
    const onA = m0;
    const got = nextSignal(onB, onA.minerId);
    expect(await sendSignal(onA, onB, 0, 'a-to-b')).toEqual({ ok: true });
    expect((await got).payload).toBe('a-to-b');
    const back = nextSignal(onA, onB.minerId);
    expect(await sendSignal(onB, onA, 0, 'b-to-a')).toEqual({ ok: true });
    expect((await back).payload).toBe('b-to-a');
    // A miner nobody holds is refused by name, wherever the sender is.
    const nobody = await new Promise<{ ok: boolean; error?: { code: string } }>((resolve) => {
      const signed = { to: 'ab'.repeat(32), kind: 'candidate' as const, payload: 'x', seq: 1 };
      onB.socket.emit('signal', { v: PROTOCOL_VERSION, ...signed, signature: onB.identity.sign('signal', signed) }, resolve);
    });
    expect(nobody.error?.code).toBe('UNKNOWN_PEER');

    // A dies without a word: B takes over the singleton jobs within seconds.
    const killedAt = Date.now();
    a.child.kill('SIGKILL');
    await until('B to take over the singleton jobs', async () => (await status(b.url))?.scaleOut?.singletonJobs, 15_000);
    const takeoverMs = Date.now() - killedAt;
    expect(takeoverMs).toBeLessThan(15_000);

    // A's miners reconnect to B (as a miner whose coordinator vanished does) and go back to their stages.
    for (const m of [m0, m2]) m.close();
    const back0 = await joined(b.url, m0.identity);
    const back2 = await joined(b.url, m2.identity);
    expect([back0.stage, back2.stage]).toEqual([0, 2]);
    const backMs = Date.now() - killedAt;
    console.log(`scale-out: B held the singleton jobs ${takeoverMs} ms after A was killed; A's two miners were registered on B ${backMs} ms after`);
    expect(backMs).toBeLessThan(15_000);
    expect((await status(b.url))?.activeMiners).toBe(3);
    // B, now the publisher, numbers the stages on from a jump (StageMapFeed.lead): the stage-1 miner, whose numbers
    // came from A, sees the gap at B's first delta, fetches again, and has the newcomer.
    const before = s1.view.seq(0)! + s1.view.seq(2)!;
    const m3 = await joined(b.url);
    await until('the stage-1 miner to see the newcomer on B after the takeover', () => holds(s1, m3.stage, m3.minerId) && holds(s1, 0, back0.minerId) && holds(s1, 2, back2.minerId), 30_000);
    expect(s1.view.seq(0)! + s1.view.seq(2)!).toBeGreaterThan(before + 1000);
    expect((await status(b.url))?.activeMiners).toBe(4);
    // And signals flow on B alone.
    const local = nextSignal(back0, s1.minerId);
    expect(await sendSignal(s1, back0, 5, 'after')).toEqual({ ok: true });
    expect((await local).payload).toBe('after');
  });

  it('drops the miners of a process that died and did not come back', { timeout: 120_000 }, async () => {
    // Continues from the run above: B alone holds the jobs. A third process joins, takes a miner, and dies.
    const c = coordinator(port + 4, env);
    await until('coordinator C', () => status(c.url), 60_000).catch((e: Error) => {
      throw new Error(`${e.message}\n${c.output()}`);
    });
    const lone = await joined(c.url);
    const b = `http://127.0.0.1:${port + 3}`;
    await until('B to count the miner on C', async () => (await status(b))?.activeMiners === 5, 20_000);
    c.child.kill('SIGKILL');
    // Its heartbeats stop reaching the database; B's sweep drops it (silent 15 s, plus twice the writes' period).
    await until('B to drop the miner of the dead process', async () => (await status(b))?.activeMiners === 4, 60_000);
    expect(lone.socket.connected).toBe(false);
  });
});
