import { randomBytes } from 'node:crypto';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import fc from 'fast-check';
import { generateIdentity, PROTOCOL_VERSION } from '@train-at-home/protocol';
import { register } from '@train-at-home/swarm';
import type { Socket } from 'socket.io-client';
import { afterEach, describe, expect, it } from 'vitest';
import { emitWithAck, hardeningHarness, type Reply } from '@train-at-home/testkit/hardening-harness';

/** How long the fuzzer sends (the suite's budget for it). */
const FUZZ_MS = 20_000;

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
const heapMb = (): number => {
  gc();
  gc();
  return process.memoryUsage().heapUsed / 2 ** 20;
};

const hex = (n: number): string => randomBytes(n).toString('hex');
const id32 = (): string => hex(32);

/** A well-formed message of each socket event, for mutation (names a real miner where it must). */
function templates(self: string, peer: string): Record<string, Record<string, unknown>> {
  return {
    hello: { v: PROTOCOL_VERSION, publicKey: `0x${id32()}` },
    register: { v: PROTOCOL_VERSION, publicKey: `0x${id32()}`, challenge: `0x${id32()}`, backend: 'wasm', tokensPerSec: 10, signature: `0x${hex(64)}` },
    heartbeat: { v: PROTOCOL_VERSION, seq: 1 },
    signal: { v: PROTOCOL_VERSION, to: peer, kind: 'offer', payload: 'v=0', seq: 1, signature: `0x${hex(64)}` },
    receipt: { v: PROTOCOL_VERSION, epoch: 0, activationId: hex(16), direction: 'activation', from: self, to: peer, bytes: 10, payloadHash: hex(32) },
    loss: { v: PROTOCOL_VERSION, epoch: 0, activationId: hex(16), pathway: [peer, self], loss: 3.2 },
    'merge-ready': { v: PROTOCOL_VERSION, stage: 0, round: 1, stateId: hex(32), microbatches: 3, weightsHash: hex(32), optimizerHash: hex(32), contributionRoots: { outer: hex(32), average: hex(32) } },
    merged: { v: PROTOCOL_VERSION, stage: 0, round: 1, ok: true, hash: hex(32), clipped: 0, evidence: [{ partition: 0, owners: [self, peer], hashes: [hex(32), hex(32)], liar: peer }] },
    frame: { v: PROTOCOL_VERSION, to: peer, chunk: new Uint8Array(randomBytes(64)) },
    ice: { v: PROTOCOL_VERSION },
  };
}

/** Values that break code that trusts its input. */
const nasty = fc.oneof(
  fc.anything({ withBigInt: false, withBoxedValues: false, withMap: false, withSet: false, withTypedArray: true, withDate: true, withNullPrototype: true, withObjectString: true }),
  fc.constantFrom(NaN, Infinity, -Infinity, -1, 2 ** 31, 2 ** 53 + 1, 1e300, -0, '', '0', '..', '../../etc/passwd', '__proto__', 'constructor', { toString: 1 }, { __proto__: { v: 1 } }, [], [[]], null, undefined, true),
  fc.string({ maxLength: 200 }),
  fc.integer(),
  fc.double(),
);

/** A message of an event: random, or a valid template with some fields replaced, removed or added. */
const mutated = (template: Record<string, unknown>) =>
  fc.oneof(
    nasty,
    fc.record({ field: fc.constantFrom(...Object.keys(template), 'extra', '__proto__'), value: nasty, drop: fc.boolean() }).map(({ field, value, drop }) => {
      const m: Record<string, unknown> = { ...template };
      if (drop) delete m[field];
      else m[field] = value;
      return m;
    }),
  );

const EVENTS = ['hello', 'register', 'heartbeat', 'signal', 'receipt', 'loss', 'merge-ready', 'merged', 'frame', 'ice'];
const PATHS = [
  '/api/status',
  '/api/stages',
  '/api/metrics',
  '/api/metrics/train_loss',
  '/api/metrics/:x',
  '/api/merges',
  '/api/receipts',
  '/api/checkpoints',
  '/api/checkpoints/:x',
  '/api/checkpoints/:x/latest',
  '/api/probes/:x',
  '/api/epochs',
  '/api/epochs/:x',
  '/api/epochs/:x/payouts/:x',
  '/api/miners/:x/score',
  '/api/leaderboard',
  '/api/rewards/challenge',
  '/api/rewards/link',
  '/api/rewards/claim',
  '/api/rewards/:x',
  '/api/rewards/:x/claims',
  '/data/:x',
  '/data/sotu-brown-v1-bpe320/:x',
  '/:x',
  '/socket.io/:x',
];
const segment = fc.oneof(fc.constantFrom('0', '1', '2147483648', '1e10', '-1', '..', '%2e%2e', '%00', 'manifest.json', 'a'.repeat(300), id32(), `0x${id32()}`), fc.string({ maxLength: 40 }).map(encodeURIComponent));
const request = fc.record({
  method: fc.constantFrom('GET', 'GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS', 'HEAD'),
  path: fc.constantFrom(...PATHS),
  segments: fc.array(segment, { minLength: 2, maxLength: 2 }),
  query: fc.dictionary(fc.constantFrom('limit', 'after', 'before', 'epoch', 'eventsAfter', 'payoutsAfter', 'x', '__proto__'), fc.oneof(segment, fc.string({ maxLength: 20 })), { maxKeys: 3 }),
  type: fc.constantFrom('application/json', 'application/octet-stream', 'text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', ''),
  body: fc.oneof(fc.json({ maxDepth: 4 }), fc.uint8Array({ maxLength: 2048 }), fc.string({ maxLength: 500 }), fc.constant('')),
  headers: fc.dictionary(fc.constantFrom('x-miner-id', 'x-step', 'x-signature', 'range', 'x-forwarded-for'), segment, { maxKeys: 3 }),
});

/**
 * Random and mutated payloads on every socket event and HTTP route for
 * FUZZ_MS, over loopback; afterwards the coordinator is up and answers
 * quickly, its heap is back near where it started, an honest miner can
 * register, and nothing was answered with a 5xx or an INTERNAL rejection.
 */
describe('fuzzing every entry point', () => {
  const h = hardeningHarness();
  afterEach(() => h.close());

  it('no 5xx, no INTERNAL, the process stays up, memory returns, and a legit miner can still register', async () => {
    // Every fuzzer comes from loopback: the per-IP request budget and the registrations per address are raised so that
    // its messages reach the handlers behind them (hardening/rate-limits.test checks those budgets).
    const { app, url } = await h.start('hardening-fuzz', undefined, { http: { requestsPerIpPerMinute: 1_000_000 }, socketRates: { 'register-per-address': { max: 1_000_000, perMs: 60_000 } } });
    // Two honest miners the fuzzed messages can name, so handlers get past "no such miner".
    const honestSockets = await Promise.all([0, 1].map(() => h.open(url)));
    const honest = await Promise.all(honestSockets.map((s) => register(s, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 })));
    const [self, peer] = honest.map((r) => r.minerId) as [string, string];
    // They beat like miners do, so they stay in the run while the fuzzers send.
    let seq = 0;
    const beat = setInterval(() => honestSockets.forEach((s) => s.emit('heartbeat', { v: PROTOCOL_VERSION, seq: seq++ }, () => {})), 2000);
    const heapBefore = heapMb();

    const statuses = new Map<number, number>();
    const internal: Array<{ event: string; reply: Reply }> = [];
    const serverErrors: string[] = [];
    let socketMessages = 0;
    let httpRequests = 0;
    const deadline = Date.now() + FUZZ_MS;

    /** One fuzzing client: registers (sometimes), then sends mutated events until it is disconnected or time is up. */
    const socketFuzzer = async (): Promise<void> => {
      while (Date.now() < deadline) {
        let socket: Socket;
        try {
          socket = await h.open(url);
        } catch {
          continue;
        }
        if (Math.random() < 0.5) await register(socket, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 }).catch(() => undefined);
        const t = templates(self, peer);
        while (socket.connected && Date.now() < deadline) {
          const event = Math.random() < 0.05 ? fc.sample(fc.string({ maxLength: 30 }), 1)[0]! : EVENTS[Math.floor(Math.random() * EVENTS.length)]!;
          const [payload] = fc.sample(mutated(t[event] ?? {}), 1);
          const reply = await Promise.race([
            new Promise<Reply | undefined>((resolve) => {
              try {
                socket.emit(event, payload, resolve);
                socketMessages++;
              } catch {
                resolve(undefined); // a value this client cannot encode is never sent
              }
            }),
            new Promise<undefined>((resolve) => setTimeout(resolve, 2000)),
          ]);
          if (reply?.error?.code === 'INTERNAL') internal.push({ event, reply });
        }
        socket.disconnect();
      }
    };

    const httpFuzzer = async (): Promise<void> => {
      while (Date.now() < deadline) {
        const [r] = fc.sample(request, 1);
        let path = r!.path;
        for (const s of r!.segments) path = path.replace(':x', s);
        const qs = new URLSearchParams(r!.query as Record<string, string>).toString();
        const withBody = !['GET', 'HEAD', 'OPTIONS'].includes(r!.method);
        const body = typeof r!.body === 'string' ? r!.body : r!.body instanceof Uint8Array ? r!.body : JSON.stringify(r!.body);
        httpRequests++;
        try {
          const res = await fetch(`${url}${path}${qs ? `?${qs}` : ''}`, {
            method: r!.method,
            headers: { ...(r!.type ? { 'content-type': r!.type } : {}), ...(r!.headers as Record<string, string>) },
            body: withBody ? (body as BodyInit) : undefined,
            signal: AbortSignal.timeout(5000),
          });
          statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
          if (res.status >= 500) serverErrors.push(`${r!.method} ${path}?${qs} → ${res.status} ${(await res.text()).slice(0, 200)}`);
          else await res.arrayBuffer();
        } catch {
          // a refused or reset connection is an answer too (caps, timeouts); the checks below tell if the process is well
        }
      }
    };

    await Promise.all([socketFuzzer(), socketFuzzer(), socketFuzzer(), httpFuzzer(), httpFuzzer()]).finally(() => clearInterval(beat));
    console.log(`fuzz: ${socketMessages} socket messages, ${httpRequests} HTTP requests, statuses ${JSON.stringify(Object.fromEntries(statuses))}`);

    expect(serverErrors).toEqual([]);
    expect(internal).toEqual([]);
    expect(socketMessages).toBeGreaterThan(500);
    expect(httpRequests).toBeGreaterThan(500);
    // Still up, and answering. (How quickly /api/status answers under load is bench:load's statusP99Ms, not a test's.)
    const status = await fetch(`${url}/api/status`);
    expect(status.status).toBe(200);
    // An honest miner registers, and the two from before are still there.
    const newcomer = await register(await h.open(url), generateIdentity(), { backend: 'wasm', tokensPerSec: 1 });
    expect((await app.coordinator.stageMap()).flatMap((s) => s.miners.map((m) => m.id))).toEqual(expect.arrayContaining([self, peer, newcomer.minerId]));
    // Memory is back near where it started (what the fuzzing held was let go).
    h.disconnectAll();
    await new Promise((r) => setTimeout(r, 500));
    const heapAfter = heapMb();
    console.log(`fuzz: heap ${heapBefore.toFixed(0)} MB before, ${heapAfter.toFixed(0)} MB after`);
    expect(heapAfter - heapBefore).toBeLessThan(64);
  }, 90_000);
});
