import proxyaddr from '@fastify/proxy-addr';
import type { AppOptions, HttpLimits } from './app';
import type { IncentiveSettings } from './run-config';
import { DEFAULT_HEARTBEAT_MS, MIN_SILENT_MS, SILENT_HEARTBEATS } from './liveness';
import { DEFAULT_SOCKET_RATES, type SocketRate, type SocketRates } from './socket/rate-limits';

/** A setting an operator gave that cannot be used: named, with what it must be. */
export class SettingError extends Error {
  constructor(
    readonly setting: string,
    message: string,
  ) {
    super(`${setting}: ${message}`);
    this.name = 'SettingError';
  }
}


/**
 * The limits and timings an operator sets on the command line or in the
 * environment (the flag wins), each checked; the values as given, by name:
 *   --max-connections-per-ip N          TAH_MAX_CONNECTIONS_PER_IP
 *   --requests-per-ip-per-minute N      TAH_REQUESTS_PER_IP_PER_MINUTE
 *   --socket-rates event=max/ms,…       TAH_SOCKET_RATES   (e.g. heartbeat=10/1000,receipt=800/1000)
 *   --heartbeat-ms N                    TAH_HEARTBEAT_MS   (told to miners when they register)
 *   --silent-ms N                       TAH_SILENT_MS      (default: 7.5 heartbeats, at least 15 s)
 *   --trust-proxy addr,…                TAH_TRUST_PROXY    (the load balancers' addresses or CIDRs, or loopback)
 *   --evaluate-seconds N                TAH_EVALUATE_SECONDS (held-out loss and a sample at most this often: 30 s; two minutes with local miners)
 */
export interface OperatorInput {
  maxConnectionsPerIp?: string;
  requestsPerIpPerMinute?: string;
  socketRates?: string;
  heartbeatMs?: string;
  silentMs?: string;
  trustProxy?: string;
  evaluateSeconds?: string;
}

export const OPERATOR_FLAGS = {
  'max-connections-per-ip': 'TAH_MAX_CONNECTIONS_PER_IP',
  'requests-per-ip-per-minute': 'TAH_REQUESTS_PER_IP_PER_MINUTE',
  'socket-rates': 'TAH_SOCKET_RATES',
  'heartbeat-ms': 'TAH_HEARTBEAT_MS',
  'silent-ms': 'TAH_SILENT_MS',
  'trust-proxy': 'TAH_TRUST_PROXY',
  'evaluate-seconds': 'TAH_EVALUATE_SECONDS',
} as const;

/**
 * The emission clock and audit rates of a run this process starts (a stored run keeps the ones it started with):
 * how long an epoch is, how long after its window ends it is settled, how many epochs after it its earnings wait
 * for, and the share of rounds drawn for a whole-round audit (run-config.ts, IncentiveSettings):
 *   --epoch-seconds N                   TAH_EPOCH_SECONDS          (an hour by default; two minutes with local miners)
 *   --settle-after-seconds N            TAH_SETTLE_AFTER_SECONDS   (ten minutes; one with local miners)
 *   --hold-epochs N                     TAH_HOLD_EPOCHS            (2; none with local miners)
 *   --audit-rate P                      TAH_AUDIT_RATE             (0.2: a proven replica's rounds drawn)
 *   --unproven-audit-rate P             TAH_UNPROVEN_AUDIT_RATE    (1: every round of a replica not yet proven; with local miners, the audit rate)
 */
export interface IncentiveInput {
  epochSeconds?: string;
  settleAfterSeconds?: string;
  holdEpochs?: string;
  auditRate?: string;
  unprovenAuditRate?: string;
}

export const INCENTIVE_FLAGS = {
  'epoch-seconds': 'TAH_EPOCH_SECONDS',
  'settle-after-seconds': 'TAH_SETTLE_AFTER_SECONDS',
  'hold-epochs': 'TAH_HOLD_EPOCHS',
  'audit-rate': 'TAH_AUDIT_RATE',
  'unproven-audit-rate': 'TAH_UNPROVEN_AUDIT_RATE',
} as const;

/** The emission clock and audit rates an operator set for a new run: only what was given, each checked. */
export function incentiveSettings(input: IncentiveInput): Partial<Pick<IncentiveSettings, 'epochMs' | 'settleAfterMs' | 'holdEpochs' | 'auditRate' | 'unprovenAuditRate'>> {
  return {
    ...(input.epochSeconds !== undefined ? { epochMs: 1000 * whole('epoch-seconds', input.epochSeconds, 10, 7 * 86_400) } : {}),
    ...(input.settleAfterSeconds !== undefined ? { settleAfterMs: 1000 * whole('settle-after-seconds', input.settleAfterSeconds, 0, 86_400) } : {}),
    ...(input.holdEpochs !== undefined ? { holdEpochs: whole('hold-epochs', input.holdEpochs, 0, 100) } : {}),
    ...(input.auditRate !== undefined ? { auditRate: share('audit-rate', input.auditRate) } : {}),
    ...(input.unprovenAuditRate !== undefined ? { unprovenAuditRate: share('unproven-audit-rate', input.unprovenAuditRate) } : {}),
  };
}

/** A share of rounds: a decimal from 0 (none drawn) to 1 (every one). */
function share(setting: string, raw: string): number {
  if (!/^(0|1|0?\.[0-9]+|1\.0*)$/.test(raw.trim())) throw new SettingError(setting, `must be a share of rounds from 0 to 1 (0.05: one round in twenty), not ${JSON.stringify(raw)}`);
  return Number(raw);
}

function whole(setting: string, raw: string, min: number, max: number): number {
  if (!/^[0-9]+$/.test(raw.trim()) || Number(raw) < min || Number(raw) > max) throw new SettingError(setting, `must be a whole number in ${min}…${max}, not ${JSON.stringify(raw)}`);
  return Number(raw);
}

/** `event=max/ms,…`: budgets of socket events (socket/rate-limits.ts); events not named keep theirs. */
export function parseSocketRates(raw: string): Partial<SocketRates> {
  const out: Partial<SocketRates> = {};
  for (const part of raw.split(',').map((p) => p.trim()).filter(Boolean)) {
    const m = /^([a-z-]+)=([0-9]+)\/([0-9]+)$/.exec(part);
    if (!m) throw new SettingError('socket-rates', `each entry is event=max/ms (heartbeat=10/1000), not ${JSON.stringify(part)}`);
    const event = m[1] as keyof SocketRates;
    if (!Object.hasOwn(DEFAULT_SOCKET_RATES, event)) throw new SettingError('socket-rates', `no event ${event}; events: ${Object.keys(DEFAULT_SOCKET_RATES).join(', ')}`);
    const rate: SocketRate = { max: whole(`socket-rates ${event} max`, m[2]!, 1, 1_000_000), perMs: whole(`socket-rates ${event} ms`, m[3]!, 1000, 3_600_000) };
    out[event] = rate;
  }
  return out;
}

/**
 * `addr,…`: the load balancers in front of the coordinator (IP addresses, CIDRs, or proxy-addr's names
 * `loopback`, `linklocal`, `uniquelocal`). From these, a request's client is the one X-Forwarded-For names.
 */
export function parseTrustedProxies(raw: string): string[] {
  const list = raw.split(',').map((p) => p.trim()).filter(Boolean);
  if (list.length === 0) throw new SettingError('trust-proxy', 'names at least one address, CIDR, loopback, linklocal or uniquelocal');
  for (const entry of list) {
    try {
      proxyaddr.compile(entry);
    } catch {
      throw new SettingError('trust-proxy', `each entry is an IP address, a CIDR (10.0.0.0/8), loopback, linklocal or uniquelocal, not ${JSON.stringify(entry)}`);
    }
  }
  return list;
}

/** What the operator's settings make of the app's options. */
export function operatorSettings(input: OperatorInput): Pick<AppOptions, 'http' | 'socketRates' | 'heartbeatMs' | 'silentMs' | 'evaluateEveryMs'> {
  const http: Partial<HttpLimits> = {};
  if (input.maxConnectionsPerIp !== undefined) http.maxConnectionsPerIp = whole('max-connections-per-ip', input.maxConnectionsPerIp, 1, 1_000_000);
  if (input.requestsPerIpPerMinute !== undefined) http.requestsPerIpPerMinute = whole('requests-per-ip-per-minute', input.requestsPerIpPerMinute, 1, 10_000_000);
  if (input.trustProxy !== undefined) http.trustedProxies = parseTrustedProxies(input.trustProxy);
  const heartbeatMs = input.heartbeatMs === undefined ? DEFAULT_HEARTBEAT_MS : whole('heartbeat-ms', input.heartbeatMs, 500, 60_000);
  const silentMs = input.silentMs === undefined ? Math.max(MIN_SILENT_MS, SILENT_HEARTBEATS * heartbeatMs) : whole('silent-ms', input.silentMs, 1000, 3_600_000);
  if (silentMs < 2 * heartbeatMs) throw new SettingError('silent-ms', `must be at least two heartbeats (${2 * heartbeatMs} ms): a miner would be dropped between two of its heartbeats`);
  return {
    http,
    socketRates: input.socketRates === undefined ? {} : parseSocketRates(input.socketRates),
    heartbeatMs,
    silentMs,
    ...(input.evaluateSeconds !== undefined ? { evaluateEveryMs: 1000 * whole('evaluate-seconds', input.evaluateSeconds, 5, 86_400) } : {}),
  };
}
