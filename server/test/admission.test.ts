import { generateIdentity, type AdmissionQueued, type Identity } from '@train-at-home/protocol';
import { register, type Registration } from '@train-at-home/swarm';
import { io as connect, type Socket } from 'socket.io-client';
import { afterAll, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';
import { ASSIGNMENT_LOCK } from '../src/socket/handlers';
import { AdmissionQueue, AdmissionSuperseded, type AdmissionWaiter } from '../src/admission';
import { testDatabase } from '@train-at-home/testkit/database';

/** Newcomers queued behind the one under way: enough that the last wait through several of the queue's updates. */
const QUEUED = 60;
const TELL_EVERY_MS = 50;

let app: App | undefined;
let url = '';
const sockets: Socket[] = [];
afterAll(async () => {
  sockets.forEach((s) => s.disconnect());
  await app?.close();
});

async function open(): Promise<Socket> {
  const socket = connect(url, { transports: ['websocket'], reconnection: false, forceNew: true });
  sockets.push(socket);
  await new Promise<void>((resolve, reject) => (socket.once('connect', resolve), socket.once('connect_error', reject)));
  return socket;
}

/** A newcomer's registration, with every place it was told while it waited. */
interface Joiner {
  identity: Identity;
  told: AdmissionQueued[];
  joined: Promise<Registration>;
  socket: Socket;
}

async function join(identity: Identity = generateIdentity(), told: AdmissionQueued[] = []): Promise<Joiner> {
  const socket = await open();
  const joined = register(socket, identity, { backend: 'wasm', tokensPerSec: 100 }, (u) => told.push(u));
  joined.catch(() => undefined); // a superseded one's end is asserted where it is expected
  return { identity, told, joined, socket };
}

const until = async (check: () => boolean, what: string): Promise<void> => {
  await expect.poll(check, { timeout: 30_000, interval: 5, message: what }).toBe(true);
};

describe('admission', () => {
  it('a queued newcomer is told its place, sees it fall, is admitted in order, and a reconnection keeps its place', async () => {
    app = await buildApp({
      silentMs: 600_000,
      run: { name: 'admission', preset: 'tiny', stages: 3, bottleneck: 32 },
      database: await testDatabase(),
      admission: { concurrent: 1, tellEveryMs: TELL_EVERY_MS },
      socketRates: { 'register-per-address': { max: 1000, perMs: 60_000 } },
    });
    url = await app.fastify.listen({ port: 0, host: '127.0.0.1' });
    const admission = app.coordinator.admission;
    // A coordinator whose joins take 30 ms each of database time (a trigger of the test's: a loaded server), so that
    // the queue drains over many of its updates and every newcomer behind the first few sees its place fall.
    await app.db.query(`CREATE FUNCTION slow_join() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.03); RETURN NEW; END $$`);
    await app.db.query('CREATE TRIGGER slow_join BEFORE INSERT ON miners FOR EACH ROW EXECUTE FUNCTION slow_join()');

    // The registration under way holds the assignment's lock, held here by a transaction of the test's (on PGlite,
    // the whole database): every newcomer behind it waits its turn.
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let locked!: () => void;
    const holding = new Promise<void>((r) => (locked = r));
    const held = app.db.transaction(async (tx) => {
      await tx.query('SELECT pg_advisory_xact_lock($1, $2)', [ASSIGNMENT_LOCK, app!.coordinator.runId]);
      locked();
      await gate;
    });
    await holding;
    const head = await join();
    await until(() => admission.underWay === 1, 'the first registration is under way');
    expect(head.told).toEqual([]); // nobody ahead: it was never queued

    // Newcomers one at a time, each told its place as it arrives: the order they queued in is known.
    const queued: Joiner[] = [];
    for (let i = 1; i <= QUEUED; i++) {
      const j = await join();
      await until(() => j.told.length > 0, `newcomer ${i} is told its place`);
      expect(j.told[0]!.position).toBe(i);
      expect(j.told[0]!.estimateMs).toBeGreaterThan(0);
      queued.push(j);
    }
    // Its connection drops while it waits; it comes back under the same key: its place is kept, not the back of the queue.
    const back = queued[2]!;
    back.socket.disconnect();
    await expect(back.joined).rejects.toThrow();
    const before = back.told.length;
    const again = await join(back.identity, back.told);
    await until(() => back.told.length > before, 'the returning newcomer is told its place');
    expect(back.told.at(-1)!.position).toBe(3);
    queued[2] = { ...again, told: back.told };
    // Nobody waiting is admitted while the one under way holds the lock: their places stay as told.
    await new Promise((r) => setTimeout(r, 4 * TELL_EVERY_MS));
    expect(admission.queued).toBe(QUEUED);
    for (const [i, j] of queued.entries()) expect(j.told.at(-1)!.position).toBe(i + 1);

    const t0 = performance.now();
    const n0 = queued.map((j) => j.told.length);
    release();
    await held;
    const registrations = await Promise.all([head, ...queued].map((j) => j.joined));
    console.log(`admission: ${QUEUED + 1} joins drained in ${Math.round(performance.now() - t0)} ms; places told after the release, by newcomer ${JSON.stringify(queued.map((j, i) => j.told.length - n0[i]!))}`);
    expect(new Set(registrations.map((r) => r.minerId)).size).toBe(QUEUED + 1);
    expect(admission.queued).toBe(0);

    // Every place told only ever fell (never reset to the back); those at the back saw it fall while they waited.
    for (const j of queued) {
      const positions = j.told.map((u) => u.position);
      for (let k = 1; k < positions.length; k++) expect(positions[k]).toBeLessThanOrEqual(positions[k - 1]!);
    }
    for (const j of queued.slice(5)) expect(j.told.at(-1)!.position).toBeLessThan(j.told[0]!.position);
    // Admitted in the order they queued: each one's registration was stored after the one ahead of it.
    const rows = await app.db.query<{ id: string }>('SELECT id FROM miners WHERE run_id = $1 ORDER BY registered_at, id', [app.coordinator.runId]);
    expect(rows.map((r) => r.id)).toEqual(registrations.map((r) => r.minerId));
  });

  it('keeps the place of a miner whose connection dropped for its grace, admits those behind it meanwhile, and gives the place up after', async () => {
    const queue = new AdmissionQueue({ concurrent: 1, tellEveryMs: 10, graceMs: 150 });
    const waiter = (): AdmissionWaiter & { connected: boolean; told: number[] } => {
      const w = { connected: true, told: [] as number[], tell: (u: AdmissionQueued) => void w.told.push(u.position) };
      return w;
    };
    const doneA = await queue.enter('a', waiter());
    const wb = waiter();
    const b = queue.enter('b', wb);
    const c = queue.enter('c', waiter());
    expect(queue.queued).toBe(2);
    wb.connected = false; // b's connection drops while it waits at the front
    doneA();
    const doneC = await c; // c is admitted past it…
    expect(queue.queued).toBe(1); // …and b's place is kept
    const wb2 = waiter();
    const b2 = queue.enter('b', wb2); // b comes back on a new connection: its old wait ends, its place is its own again
    await expect(b).rejects.toBeInstanceOf(AdmissionSuperseded);
    expect(wb2.told).toEqual([1]);
    doneC();
    (await b2)();
    expect([queue.queued, queue.underWay, queue.admitted]).toEqual([0, 0, 3]);

    // A place whose miner does not come back within the grace is given up, and nothing waits on it.
    const doneE = await queue.enter('e', waiter());
    const wd = waiter();
    const d = queue.enter('d', wd);
    wd.connected = false;
    await expect(d).rejects.toBeInstanceOf(AdmissionSuperseded);
    expect(queue.queued).toBe(0);
    doneE();
    queue.close();
  });
});
