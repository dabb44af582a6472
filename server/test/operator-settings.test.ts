import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { generateIdentity } from '@train-at-home/protocol';
import { register } from '@train-at-home/swarm';
import { io as connect } from 'socket.io-client';
import { afterEach, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';
import { testDatabase } from '@train-at-home/testkit/database';
import { SettingError, incentiveSettings, operatorSettings } from '../src/operator-settings';

const MAIN = fileURLToPath(new URL('../src/main.ts', import.meta.url));
const TSX = pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href;

let app: App | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

/** The setting a parser refuses this input for (a SettingError), or 'accepted'. */
function refusedBy<I>(parse: (input: I) => unknown, input: I): string {
  try {
    parse(input);
  } catch (e) {
    expect(e).toBeInstanceOf(SettingError);
    return (e as SettingError).setting;
  }
  return 'accepted';
}

describe("the operator's settings", () => {
  it('reads limits and timings, and refuses a bad one by name', () => {
    expect(operatorSettings({})).toEqual({ http: {}, socketRates: {}, heartbeatMs: 2000, silentMs: 15_000 });
    expect(
      operatorSettings({ maxConnectionsPerIp: '4000', requestsPerIpPerMinute: '600', socketRates: 'heartbeat=5/1000, receipt=800/2000', heartbeatMs: '4000' }),
    ).toEqual({
      http: { maxConnectionsPerIp: 4000, requestsPerIpPerMinute: 600 },
      socketRates: { heartbeat: { max: 5, perMs: 1000 }, receipt: { max: 800, perMs: 2000 } },
      heartbeatMs: 4000,
      silentMs: 30_000, // 7.5 heartbeats
    });
    const refused = (input: Parameters<typeof operatorSettings>[0]): string => refusedBy(operatorSettings, input);
    expect(refused({ maxConnectionsPerIp: '0' })).toBe('max-connections-per-ip');
    expect(refused({ requestsPerIpPerMinute: '12.5' })).toBe('requests-per-ip-per-minute');
    expect(refused({ socketRates: 'heartbeat=10' })).toBe('socket-rates');
    expect(refused({ socketRates: 'teleport=1/1000' })).toBe('socket-rates');
    expect(refused({ socketRates: 'heartbeat=0/1000' })).toBe('socket-rates heartbeat max');
    expect(refused({ heartbeatMs: '100' })).toBe('heartbeat-ms');
    expect(refused({ heartbeatMs: '5000', silentMs: '6000' })).toBe('silent-ms');
    // The load balancers in front: addresses, CIDRs or proxy-addr's names; anything else is refused by name.
    expect(operatorSettings({ trustProxy: '10.0.0.5, 192.168.0.0/16,loopback' }).http).toEqual({ trustedProxies: ['10.0.0.5', '192.168.0.0/16', 'loopback'] });
    expect(refused({ trustProxy: 'balancer.example' })).toBe('trust-proxy');
    expect(refused({ trustProxy: '10.0.0.0/33' })).toBe('trust-proxy');
    expect(refused({ trustProxy: ' , ' })).toBe('trust-proxy');
    // How often the validator measures held-out loss: whole seconds, at least 5.
    expect(operatorSettings({ evaluateSeconds: '120' }).evaluateEveryMs).toBe(120_000);
    expect(operatorSettings({}).evaluateEveryMs).toBeUndefined();
    for (const bad of ['2', '1.5', 'often']) expect(refused({ evaluateSeconds: bad }), bad).toBe('evaluate-seconds');
  });

  it("reads a new run's emission clock and audit rates, and refuses a bad one by name", () => {
    expect(incentiveSettings({})).toEqual({});
    expect(incentiveSettings({ epochSeconds: '600', settleAfterSeconds: '0', holdEpochs: '1' })).toEqual({ epochMs: 600_000, settleAfterMs: 0, holdEpochs: 1 });
    expect(incentiveSettings({ auditRate: '0.05', unprovenAuditRate: '1' })).toEqual({ auditRate: 0.05, unprovenAuditRate: 1 });
    expect(incentiveSettings({ auditRate: '0', unprovenAuditRate: '.5' })).toEqual({ auditRate: 0, unprovenAuditRate: 0.5 });
    const refused = (input: Parameters<typeof incentiveSettings>[0]): string => refusedBy(incentiveSettings, input);
    expect(refused({ epochSeconds: '5' })).toBe('epoch-seconds');
    expect(refused({ epochSeconds: '1h' })).toBe('epoch-seconds');
    expect(refused({ settleAfterSeconds: '-1' })).toBe('settle-after-seconds');
    expect(refused({ holdEpochs: '2.5' })).toBe('hold-epochs');
    for (const bad of ['1.5', '-0.1', '5%', '', 'NaN', '1e-3']) expect(refused({ auditRate: bad }), bad).toBe('audit-rate');
    expect(refused({ unprovenAuditRate: '2' })).toBe('unproven-audit-rate');
  });

  it('tells each miner the heartbeat interval when it registers', async () => {
    app = await buildApp({ run: { name: 'operator', preset: 'tiny', stages: 3, bottleneck: 32 }, database: await testDatabase(), ...operatorSettings({ heartbeatMs: '3000' }) });
    const url = await app.fastify.listen({ port: 0, host: '127.0.0.1' });
    const socket = connect(url, { transports: ['websocket'], reconnection: false, forceNew: true });
    try {
      expect((await register(socket, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 })).heartbeatMs).toBe(3000);
    } finally {
      socket.disconnect();
    }
  });

  it('the command line refuses a bad setting from the environment before it starts, naming it', { timeout: 60_000 }, async () => {
    const child = spawn(process.execPath, ['--import', TSX, MAIN, '--port', '0', '--host', '127.0.0.1', '--local-miners', '0'], {
      env: { ...process.env, TAH_HEARTBEAT_MS: '10' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout!.on('data', (c: Buffer) => (output += c.toString()));
    child.stderr!.on('data', (c: Buffer) => (output += c.toString()));
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
    expect(code, output).toBe(2);
    expect(output).toContain('--heartbeat-ms: must be a whole number in 500…60000, not "10"');
  });
});
