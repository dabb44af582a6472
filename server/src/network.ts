import { createHmac } from 'node:crypto';
import type { IceConfig, IceServer } from '@train-at-home/protocol';

/**
 * How the run's peers reach each other (the operator's, from the command line: `--stun`, `--turn`,
 * TAH_TURN_SECRET, `--relay`). Served to every miner with its registration. Unlike the stored run's
 * layout these are read at each start: servers move and secrets rotate during a run.
 */
export interface NetworkSettings {
  /** STUN servers (`stun:host:port`) for server-reflexive candidates. None by default: no public server is used unless named here. */
  stun: string[];
  /** TURN servers (`turn:host:3478?transport=udp`, `…?transport=tcp`, `turns:host:443?transport=tcp`); credentials are minted per miner. */
  turn: string[];
  /** coturn's `static-auth-secret` (use-auth-secret): it signs the credentials and never leaves this process. */
  turnSecret?: string;
  /** How long minted TURN credentials last; miners ask for fresh ones before they expire. */
  turnTtlSeconds: number;
  /**
   * The coordinator's own frame relay, for a pair no direct or TURN path joins: the last resort,
   * off in hosted runs (it carries training traffic through the one process that must stay light);
   * where on, each miner may relay at most `bytesPerMinute`, and is refused RELAY_CAP beyond it.
   */
  relay: { enabled: boolean; bytesPerMinute: number };
}

export const DEFAULT_NETWORK: NetworkSettings = {
  stun: [],
  turn: [],
  turnTtlSeconds: 3600,
  relay: { enabled: false, bytesPerMinute: 64 * 1024 * 1024 },
};

export class NetworkConfigError extends Error {
  override name = 'NetworkConfigError';
}

const STUN_URL = /^stun:[^\s?]+$/;
const TURN_URL = /^turns?:[^\s?]+(\?transport=(udp|tcp))?$/;

/** The settings with defaults filled in; a URL that is not STUN or TURN, or TURN without a secret, is refused by name. */
export function networkSettings(overrides: Partial<NetworkSettings> = {}): NetworkSettings {
  const s: NetworkSettings = { ...DEFAULT_NETWORK, ...overrides, relay: { ...DEFAULT_NETWORK.relay, ...overrides.relay } };
  for (const url of s.stun) if (!STUN_URL.test(url)) throw new NetworkConfigError(`not a STUN URL: ${url} (stun:host:port)`);
  for (const url of s.turn) if (!TURN_URL.test(url)) throw new NetworkConfigError(`not a TURN URL: ${url} (turn:host:port?transport=udp|tcp, turns:host:443?transport=tcp)`);
  if (s.turn.length > 0 && !s.turnSecret) throw new NetworkConfigError('TURN servers need the secret coturn shares with the coordinator (TAH_TURN_SECRET)');
  if (!(Number.isSafeInteger(s.turnTtlSeconds) && s.turnTtlSeconds >= 60)) throw new NetworkConfigError(`turnTtlSeconds must be a whole number of at least 60, not ${s.turnTtlSeconds}`);
  if (!(Number.isSafeInteger(s.relay.bytesPerMinute) && s.relay.bytesPerMinute > 0)) throw new NetworkConfigError(`relay.bytesPerMinute must be a positive whole number, not ${s.relay.bytesPerMinute}`);
  return s;
}

/**
 * TURN REST credentials (draft-uberti-behave-turn-rest, coturn's use-auth-secret): the username is
 * `expiry:minerId` (expiry in seconds since the epoch), the password base64(HMAC-SHA1(secret, username)).
 * coturn recomputes the password from the username and refuses it once the expiry has passed.
 */
export function turnCredentials(secret: string, minerId: string, expiresAtMs: number): { username: string; credential: string } {
  const username = `${Math.floor(expiresAtMs / 1000)}:${minerId}`;
  return { username, credential: createHmac('sha1', secret).update(username).digest('base64') };
}

/** What one miner is told: the STUN servers, the TURN servers with credentials minted for it now, and whether the relay is on. */
export function iceFor(settings: NetworkSettings, minerId: string, nowMs = Date.now()): IceConfig {
  const iceServers: IceServer[] = [];
  if (settings.stun.length > 0) iceServers.push({ urls: [...settings.stun] });
  let expiresAt: number | null = null;
  if (settings.turn.length > 0 && settings.turnSecret) {
    expiresAt = nowMs + settings.turnTtlSeconds * 1000;
    iceServers.push({ urls: [...settings.turn], ...turnCredentials(settings.turnSecret, minerId, expiresAt) });
  }
  return { iceServers, expiresAt, relay: settings.relay.enabled };
}

/**
 * Each miner's relayed bytes in its current minute; a chunk that would pass the
 * cap is refused (RELAY_CAP) with the time to wait. A miner's minute starts at
 * its first relayed chunk (not on the clock's minute), so a burst can never
 * straddle a minute boundary and carry twice the cap in a few seconds.
 */
export class RelayBudget {
  private readonly used = new Map<string, { since: number; bytes: number }>();
  private sweptAt = 0;

  constructor(private readonly bytesPerMinute: number) {}

  /** Counts the bytes and returns undefined, or returns the milliseconds until the miner may relay again. */
  take(minerId: string, bytes: number, nowMs = Date.now()): number | undefined {
    if (nowMs - this.sweptAt >= 60_000) {
      // Forget minutes that are over, so the map holds only miners relaying now.
      for (const [id, w] of this.used) if (nowMs - w.since >= 60_000) this.used.delete(id);
      this.sweptAt = nowMs;
    }
    let w = this.used.get(minerId);
    if (!w || nowMs - w.since >= 60_000) {
      w = { since: nowMs, bytes: 0 };
      this.used.set(minerId, w);
    }
    if (w.bytes + bytes > this.bytesPerMinute) return Math.max(1, w.since + 60_000 - nowMs);
    w.bytes += bytes;
    return undefined;
  }
}
