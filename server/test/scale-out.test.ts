/**
 * Scale-out mode (scale-out.ts): two coordinator processes (the real command
 * line, `main.ts`) serving one run, with one PostgreSQL database and a real
 * Redis (scripts/redis.sh) between them, and a real load balancer in front
 * (Debian's haproxy, scripts/haproxy.sh). Runs in the PostgreSQL pass
 * (scripts/test-postgres.sh), which gives it the server.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Redis } from 'ioredis';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateIdentity, PROTOCOL_VERSION, cryptoReady, type Identity } from '@train-at-home/protocol';
import { register } from '@train-at-home/swarm';
import { io as connect, type Socket } from 'socket.io-client';
import { testDatabase } from '@train-at-home/testkit/database';
import { simMiner, type SimMiner } from '@train-at-home/testkit/sim-miners';

const MAIN = fileURLToPath(new URL('../src/main.ts', import.meta.url));
const REDIS_SH = fileURLToPath(new URL('../../scripts/redis.sh', import.meta.url));
const HAPROXY_SH = fileURLToPath(new URL('../../scripts/haproxy.sh', import.meta.url));
const MINER_CLI = fileURLToPath(new URL('../../apps/miner/src/main.ts', import.meta.url));
const TSX = pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href;

const children: ChildProcess[] = [];
const miners: SimMiner[] = [];
const sockets: Socket[] = [];
/**
 * How long a takeover (the singleton jobs, the miners registered again) may take before the test calls it lost.
 * It takes seconds (printed below); the bound only tells a lost takeover from a slow one on a loaded machine.
 */
const TAKEOVER_BOUND_MS = 60_000;

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
function coordinator(port: number, env: Record<string, string>, run = 'scale-out', args: string[] = []): { child: ChildProcess; url: string; output: () => string } {
  const child = spawn(process.execPath, ['--import', TSX, MAIN, '--port', String(port), '--host', '127.0.0.1', '--preset', 'tiny', '--stages', '3', '--local-miners', '0', '--run', run, ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  let out = '';
  child.stdout!.on('data', (c: Buffer) => (out = (out + c.toString()).slice(-20_000)));
  child.stderr!.on('data', (c: Buffer) => (out = (out + c.toString()).slice(-20_000)));
  return { child, url: `http://127.0.0.1:${port}`, output: () => out };
}

async function status(url: string): Promise<{ activeMiners: number; scaleOut: { singletonJobs: boolean; connectedMiners: number } | null } | undefined> {
  try {
    const r = await fetch(`${url}/api/status`);
    return r.ok ? ((await r.json()) as { activeMiners: number; scaleOut: { singletonJobs: boolean; connectedMiners: number } | null }) : undefined;
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

/**
 * A miner that connects through the load balancer and, as the client does (Miner.start), reconnects and
 * registers again whenever its connection drops; each registration is kept, with when it was answered.
 */
function balanced(url: string): { identity: Identity; socket: Socket; registrations: { stage: number; minerId: string; at: number }[] } {
  const identity = generateIdentity();
  const socket = connect(url, { transports: ['websocket'], forceNew: true, reconnectionDelay: 500, reconnectionDelayMax: 2000 });
  sockets.push(socket);
  const registrations: { stage: number; minerId: string; at: number }[] = [];
  socket.on('connect', () => {
    register(socket, identity, { backend: 'wasm', tokensPerSec: 100 }).then(
      (r) => registrations.push({ stage: r.stage, minerId: r.minerId, at: Date.now() }),
      () => socket.disconnect().connect(),
    );
  });
  let seq = 0;
  const beat = setInterval(() => socket.connected && socket.emit('heartbeat', { v: PROTOCOL_VERSION, seq: seq++ }), 2000);
  socket.on('disconnect', (reason) => reason === 'io client disconnect' && clearInterval(beat));
  return { identity, socket, registrations };
}

/** Debian's haproxy in front of coordinator processes (scripts/haproxy.sh), once its health checks have every one in service. */
async function balancer(listen: number, ports: number[], started: ChildProcess[]): Promise<string> {
  started.push(spawn('bash', [HAPROXY_SH, String(listen), ...ports.map((p) => `127.0.0.1:${p}`)], { stdio: 'inherit', detached: true }));
  const url = `http://127.0.0.1:${listen}`;
  const seen = new Set<string>();
  // Installed first where missing (scripts/apt-install.sh): up to a couple of minutes.
  await until('the balancer to send requests to every process', async () => {
    const c = await servedBy(url);
    if (c) seen.add(c);
    return seen.size === ports.length;
  }, 150_000);
  return url;
}

/** Which coordinator (the balancer's cookie: c1 is A, c2 is B) answered a request through the balancer. */
async function servedBy(url: string): Promise<string | undefined> {
  try {
    const r = await fetch(`${url}/api/status`);
    return /tah=(c[0-9]+)/.exec(r.headers.get('set-cookie') ?? '')?.[1];
  } catch {
    return undefined;
  }
}

/** A real miner process (the CLI: model, WebRTC, the client's reconnection), its output kept. */
function minerProcess(url: string): { child: ChildProcess; output: () => string } {
  const child = spawn(process.execPath, ['--import', TSX, MINER_CLI, '--coordinator', url], { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let out = '';
  child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (out += c.toString()));
  return { child, output: () => out };
}

// Runs in the PostgreSQL pass only (package.json's test leaves it out of the embedded database's pass).
if (!process.env.TAH_TEST_DATABASE_URL) throw new Error('scale-out.test.ts needs a PostgreSQL server: run it with bash scripts/test-postgres.sh server/test/scale-out.test.ts');

describe('scale-out: two coordinator processes, one PostgreSQL, Redis', () => {
  let redis: ChildProcess;
  const balancers: ChildProcess[] = [];
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
    // Every process believes the balancer (on loopback) about who its clients are (--trust-proxy).
    env = { DATABASE_URL: db.url!, REDIS_URL: `redis://127.0.0.1:${redisPort}`, TAH_DOMAIN: 'localhost', TAH_TRUST_PROXY: 'loopback' };
  }, 180_000);

  afterAll(async () => {
    for (const m of miners) m.close();
    for (const s of sockets) s.disconnect();
    for (const c of children) c.kill('SIGKILL');
    // Each started as a process group (bash and its server); one that already ended is gone.
    for (const group of [redis, ...balancers]) {
      try {
        if (group?.pid) process.kill(-group.pid, 'SIGTERM');
      } catch {}
    }
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
    expect(bStatus.scaleOut).toEqual({ singletonJobs: false, connectedMiners: 0 });
    expect((await status(a.url))?.scaleOut).toEqual({ singletonJobs: true, connectedMiners: 0 });

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

    // The dashboard of either process shows every miner's own report, whichever process the miner is connected to.
    const say = (m: SimMiner, phase: string, microbatches: number) => m.socket.emitWithAck('heartbeat', { v: PROTOCOL_VERSION, seq: 1_000_000 + microbatches, status: { phase, tokensPerSec: 10, microbatches } });
    expect(await say(onA, 'training', 7)).toEqual({ ok: true });
    expect(await say(onB, 'merging', 9)).toEqual({ ok: true });
    type Swarm = { stages: Array<{ miners: Array<{ id: string; state: string; microbatches?: number }> }> };
    const swarmOf = async (url: string): Promise<Swarm> => ((await (await fetch(`${url}/api/dashboard`)).json()) as { swarm: Swarm }).swarm;
    const shown = (s: Swarm, id: string) => s.stages.flatMap((st) => st.miners).find((x) => x.id === id);
    for (const url of [a.url, b.url]) {
      const s = await swarmOf(url);
      expect(shown(s, onA.minerId)).toMatchObject({ state: 'training', microbatches: 7 });
      expect(shown(s, onB.minerId)).toMatchObject({ state: 'merging', microbatches: 9 });
    }

    // The load balancer in front of both (scripts/haproxy.sh): once its health checks have both processes in
    // service, a connection goes to the one with fewer through it, so of two miners that connect through it one is on each.
    const lbUrl = await balancer(port + 5, [port + 2, port + 3], balancers);
    const viaLb = [balanced(lbUrl)];
    await until('a miner to register through the balancer', () => viaLb[0]!.registrations.length === 1, 20_000);
    viaLb.push(balanced(lbUrl));
    await until('another miner to register through the balancer', () => viaLb[1]!.registrations.length === 1, 20_000);
    expect((await status(b.url))?.activeMiners).toBe(5);
    // One on each: A holds its two direct miners and one of these, B its direct one and the other.
    expect([(await status(a.url))?.scaleOut?.connectedMiners, (await status(b.url))?.scaleOut?.connectedMiners]).toEqual([3, 2]);

    // A dies without a word: B takes over the singleton jobs within seconds.
    const killedAt = Date.now();
    a.child.kill('SIGKILL');
    // The miner the balancer had sent to A reconnects through it, is sent to B, and registers again to its stage.
    await until('the miners behind the balancer to be registered again', () => viaLb.some((m) => m.registrations.length === 2) && viaLb.every((m) => m.socket.connected), TAKEOVER_BOUND_MS);
    const lbBackMs = Math.max(...viaLb.map((m) => m.registrations.at(-1)!.at)) - killedAt;
    for (const m of viaLb) expect(new Set(m.registrations.map((r) => `${r.minerId}:${r.stage}`)).size).toBe(1);
    expect(await servedBy(lbUrl)).toBe('c2');
    await until('B to take over the singleton jobs', async () => (await status(b.url))?.scaleOut?.singletonJobs, TAKEOVER_BOUND_MS);
    const takeoverMs = Date.now() - killedAt;

    // A's miners reconnect to B (as a miner whose coordinator vanished does) and go back to their stages.
    for (const m of [m0, m2]) m.close();
    const back0 = await joined(b.url, m0.identity);
    const back2 = await joined(b.url, m2.identity);
    expect([back0.stage, back2.stage]).toEqual([0, 2]);
    const backMs = Date.now() - killedAt;
    console.log(`scale-out: B held the singleton jobs ${takeoverMs} ms after A was killed; A's two miners were registered on B ${backMs} ms after; the one behind the balancer, ${lbBackMs} ms after`);
    expect((await status(b.url))?.activeMiners).toBe(5);
    // B, now the publisher, numbers the stages on from a jump (StageMapFeed.lead): the stage-1 miner, whose numbers
    // came from A, sees the gap at B's first delta, fetches again, and has the newcomer.
    const before = s1.view.seq(0)! + s1.view.seq(2)!;
    const m3 = await joined(b.url);
    await until('the stage-1 miner to see the newcomer on B after the takeover', () => holds(s1, m3.stage, m3.minerId) && holds(s1, 0, back0.minerId) && holds(s1, 2, back2.minerId), 30_000);
    expect(s1.view.seq(0)! + s1.view.seq(2)!).toBeGreaterThan(before + 1000);
    expect((await status(b.url))?.activeMiners).toBe(6);
    // And signals flow on B alone.
    const local = nextSignal(back0, s1.minerId);
    expect(await sendSignal(s1, back0, 5, 'after')).toEqual({ ok: true });
    expect((await local).payload).toBe('after');
  });

  it(
    'trains one run with miners on both, past merges; SIGKILL the process running the phases mid-run: its miners come back through the balancer within 15 s, the other takes the phases over, training goes on, and every report a miner was told is stored is',
    { timeout: 600_000 },
    async () => {
      const run = 'scale-out-train';
      // Emission epochs of 20 s, settled 5 s after they end, none held: the run settles epochs on both sides of the kill.
      const clock = ['--epoch-seconds', '20', '--settle-after-seconds', '5', '--hold-epochs', '0'];
      const a = coordinator(port + 6, env, run, clock);
      await until('A to hold the jobs lease', async () => (await status(a.url))?.scaleOut?.singletonJobs, 60_000).catch((e: Error) => {
        throw new Error(`${e.message}\n${a.output()}`);
      });
      const b = coordinator(port + 7, env, run, clock);
      await until('coordinator B', () => status(b.url), 60_000);
      const lbUrl = await balancer(port + 8, [port + 6, port + 7], balancers);
      // Three miners through the balancer, one after another: each goes to the process with fewer, so both hold miners.
      const ms: Array<ReturnType<typeof minerProcess>> = [];
      for (let i = 0; i < 3; i++) {
        ms.push(minerProcess(lbUrl));
        await until(`miner ${i + 1} to register`, async () => (await status(b.url))?.activeMiners === i + 1, 120_000).catch((e: Error) => {
          throw new Error(`${e.message}\n${ms.map((m) => m.output()).join('\n')}`);
        });
      }
      const held = [(await status(a.url))?.scaleOut?.connectedMiners ?? 0, (await status(b.url))?.scaleOut?.connectedMiners ?? 0];
      expect(held[0]! + held[1]!).toBe(3);
      expect(Math.min(...held)).toBeGreaterThan(0);
      const db = new pg.Client({ connectionString: env.DATABASE_URL });
      await db.connect();
      try {
        const runId = (await db.query<{ id: number }>('SELECT id FROM runs WHERE name = $1', [run])).rows[0]!.id;
        const closedRounds = async (): Promise<number[]> => {
          const rows = (await db.query<{ stage: number; round: number }>('SELECT stage, max(epoch)::int AS round FROM epochs WHERE run_id = $1 AND merged_hash IS NOT NULL GROUP BY stage', [runId])).rows;
          return [0, 1, 2].map((stage) => rows.find((r) => r.stage === stage)?.round ?? 0);
        };
        const losses = async (): Promise<number> => (await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM metrics WHERE run_id = $1 AND name = 'train_loss'`, [runId])).rows[0]!.n;
        // Merge answers of the miners on B reach the phases on A: every stage merges.
        await until('a merge round of every stage to close', async () => (await closedRounds()).every((r) => r >= 1), 180_000).catch((e: Error) => {
          throw new Error(`${e.message}\n${ms.map((m) => m.output()).join('\n')}\n${a.output().slice(-4000)}`);
        });
        const settled = async (): Promise<Array<{ epoch: number; at: Date; emission: string; allocated: string; paid: string | null }>> =>
          (
            await db.query(
              `SELECT s.epoch, s.settled_at AS at, s.emission::text, s.allocated::text, (SELECT sum(amount)::text FROM payouts p WHERE p.run_id = s.run_id AND p.epoch = s.epoch) AS paid
               FROM settlements s WHERE s.run_id = $1 ORDER BY s.epoch`,
              [runId],
            )
          ).rows;
        // A, which runs settlement, settles the run's first epoch (its rounds' audits done) before it dies.
        await until('A to settle an epoch', async () => (await settled()).length > 0, 90_000).catch((e: Error) => {
          throw new Error(`${e.message}
${a.output().slice(-4000)}`);
        });
        const roundsBefore = await closedRounds();
        const lossesBefore = await losses();
        expect(lossesBefore).toBeGreaterThan(0);

        // A, which runs the phases and the validator, dies mid-run.
        const outputsAtKill = ms.map((m) => m.output().length);
        const killedAt = Date.now();
        a.child.kill('SIGKILL');
        await until('B to take over the singleton jobs', async () => (await status(b.url))?.scaleOut?.singletonJobs, TAKEOVER_BOUND_MS);
        // A's miners: disconnected, then registered again through the balancer, to B.
        const hit = (i: number): string => ms[i]!.output().slice(outputsAtKill[i]);
        await until('A\'s miners to be registered again', async () => {
          const dropped = [0, 1, 2].filter((i) => /disconnected from the coordinator/.test(hit(i)));
          return dropped.length > 0 && dropped.every((i) => /re-registered with the coordinator/.test(hit(i))) && (await status(b.url))?.activeMiners === 3;
        }, TAKEOVER_BOUND_MS).catch((e: Error) => {
          throw new Error(`${e.message}\n${ms.map((_, i) => hit(i)).join('\n')}`);
        });
        const backMs = Date.now() - killedAt;
        const moved = [0, 1, 2].filter((i) => /disconnected from the coordinator/.test(hit(i))).length;
        expect(moved).toBe(held[0]);
        // The run goes on under B's phases: more losses, and a merge round of every stage closed after the takeover.
        await until('every stage to merge again under B', async () => (await closedRounds()).every((r, stage) => r > roundsBefore[stage]!), 180_000).catch((e: Error) => {
          throw new Error(`${e.message}\n${ms.map((_, i) => hit(i)).join('\n')}\n${b.output().slice(-4000)}`);
        });
        const lossesAfter = await losses();
        expect(lossesAfter).toBeGreaterThan(lossesBefore);
        // B goes on settling where A stopped: every epoch from the first settled once, in order, none skipped and
        // none settled again, each paying out exactly what it allocated, never more than its emission.
        // An epoch waits for the audits of its rounds, and for rounds begun in it to be drawn, at most holdMs past its
        // due time (jobs/settlement.ts: maxTrainingMs + readyMs + roundMs + auditTimeoutMs, 215 s here): a round A
        // opened and did not live to close can hold the first epoch B settles that long.
        const holdMs = 120_000 + 5_000 + 30_000 + 60_000;
        await until('B to settle an epoch', async () => (await settled()).some((s) => s.at.getTime() > killedAt), 20_000 + 5_000 + holdMs + 60_000).catch(async (e: Error) => {
          const audits = (await db.query(`SELECT status, count(*)::int AS n FROM audits WHERE run_id = $1 GROUP BY status`, [runId])).rows;
          const undrawn = (await db.query(`SELECT stage, round, created_at FROM audit_rounds WHERE run_id = $1 AND revealed_at IS NULL ORDER BY created_at`, [runId])).rows;
          throw new Error(`${e.message}\naudits ${JSON.stringify(audits)}, rounds not drawn ${JSON.stringify(undrawn)}, settled ${JSON.stringify(await settled())}\n${b.output().slice(-4000)}`);
        });
        const epochs = await settled();
        expect(epochs.map((s) => s.epoch)).toEqual(epochs.map((_, i) => i));
        for (const s of epochs) {
          expect(BigInt(s.paid ?? '0')).toBe(BigInt(s.allocated));
          expect(BigInt(s.allocated)).toBeLessThanOrEqual(BigInt(s.emission));
        }
        const byA = epochs.filter((s) => s.at.getTime() < killedAt).length;

        // Every loss report and receipt a miner was told is stored, is (one that was in flight when A died was sent again).
        const stats = await Promise.all(
          ms.map(async (m) => {
            m.child.kill('SIGTERM');
            await until('a miner to stop and say what was stored', () => /"minerStats"/.test(m.output()), 30_000);
            const line = m.output().split('\n').find((l) => l.includes('"minerStats"'))!;
            const id = /registered as ([0-9a-f]{8})…/.exec(m.output())![1]!;
            return { id, stored: (JSON.parse(line) as { minerStats: { stored: { loss: number; receipt: number } } }).minerStats.stored };
          }),
        );
        for (const { id, stored } of stats) {
          const [receipts] = (await db.query<{ n: number }>('SELECT count(*)::int AS n FROM receipts WHERE run_id = $1 AND reporter LIKE $2', [runId, `${id}%`])).rows;
          const [reported] = (await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM metrics WHERE run_id = $1 AND name = 'train_loss' AND (pathway::jsonb ->> -1) LIKE $2`, [runId, `${id}%`])).rows;
          expect(stored.receipt).toBeGreaterThan(0);
          expect(receipts!.n).toBeGreaterThanOrEqual(stored.receipt);
          expect(reported!.n).toBeGreaterThanOrEqual(stored.loss);
        }
        console.log(
          `scale-out training: rounds ${roundsBefore.join('/')} before the kill, ${(await closedRounds()).join('/')} after; ${moved} miner(s) moved to B in ${backMs} ms; losses ${lossesBefore} → ${lossesAfter}; epochs settled by A ${byA}, by B ${epochs.length - byA}; stored per miner ${JSON.stringify(stats)}`,
        );
      } finally {
        await db.end();
      }
    },
  );

  it('drops the miners of a process that died and did not come back', { timeout: 120_000 }, async () => {
    // Continues from the run above: B alone holds the jobs. A third process joins, takes a miner, and dies.
    const c = coordinator(port + 4, env);
    await until('coordinator C', () => status(c.url), 60_000).catch((e: Error) => {
      throw new Error(`${e.message}\n${c.output()}`);
    });
    const b = `http://127.0.0.1:${port + 3}`;
    // Socket budgets are counted in Redis, for every process: a miner's budget of TURN credential requests
    // (ice, 20 a minute) spent on C is spent on B as well, not granted again by each process it connects to.
    const ice = (m: SimMiner): Promise<{ ok: boolean; error?: { code: string; retryAfterMs?: number } }> => m.socket.emitWithAck('ice', { v: PROTOCOL_VERSION });
    const spender = await simMiner(c.url);
    for (let i = 0; i < 20; i++) expect((await ice(spender)).ok).toBe(true);
    expect((await ice(spender)).error?.code).toBe('RATE_LIMITED');
    spender.close();
    const elsewhere = await simMiner(b, spender.identity);
    const refused = await ice(elsewhere);
    expect(refused.error?.code).toBe('RATE_LIMITED');
    expect(refused.error?.retryAfterMs).toBeGreaterThan(0);
    elsewhere.close();
    const lone = await joined(c.url);
    await until('B to count the miner on C', async () => (await status(b))?.activeMiners === 7, 20_000);
    c.child.kill('SIGKILL');
    // Its heartbeats stop reaching the database; B's sweep drops it (silent 15 s, plus twice the writes' period).
    await until('B to drop the miner of the dead process', async () => (await status(b))?.activeMiners === 6, 60_000);
    expect(lone.socket.connected).toBe(false);
  });
});
