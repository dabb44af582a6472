import { describe, expect, it } from 'vitest';
import { MAX_CHUNK_BYTES, TRAFFIC_KINDS, emptyTraffic, framedBytes, saneTraffic, trafficBytes, trafficSince } from '@train-at-home/protocol';
import { TrafficMeter } from './traffic';

describe('a miner\'s traffic by kind', () => {
  it('counts peer messages as the frames that carry them, partitions as merge traffic', () => {
    const meter = new TrafficMeter();
    meter.frame('activation', 'sent', 1_000_000, 2);
    meter.frame('gradient', 'received', 10, 2);
    meter.frame('partition', 'sent', MAX_CHUNK_BYTES, 0);
    const t = meter.read();
    expect(t.activation).toEqual({ sent: framedBytes(1_000_000, 2), received: 0 });
    expect(t.activation.sent).toBe(1_000_000 + 4 * (80 + 8)); // four chunks, each with its header and pathway
    expect(t.gradient).toEqual({ sent: 0, received: 10 + 88 });
    expect(t.merge).toEqual({ sent: MAX_CHUNK_BYTES + 2 * 80, received: 0 });
    expect(trafficBytes(t)).toBe(t.activation.sent + t.gradient.received + t.merge.sent);
    expect(trafficBytes(t, ['gradient'])).toBe(98);
  });

  it('takes only byte counts, and hands out copies', () => {
    const meter = new TrafficMeter();
    for (const bad of [Number.NaN, -5, 0, Number.POSITIVE_INFINITY]) meter.add('audit', 'sent', bad);
    expect(meter.read()).toEqual(emptyTraffic());
    meter.add('checkpoint', 'received', 500);
    const copy = meter.read();
    copy.checkpoint.received = 1;
    expect(meter.read().checkpoint.received).toBe(500);
    meter.add('checkpoint', 'received', 20);
    expect(trafficSince(meter.read(), copy).checkpoint).toEqual({ sent: 0, received: 519 });
  });

  it('reads counters from elsewhere as byte counts or 0, never NaN, negative or fractional', () => {
    expect(saneTraffic(null)).toEqual(emptyTraffic());
    expect(saneTraffic('x')).toEqual(emptyTraffic());
    const t = saneTraffic({ activation: { sent: 12, received: -1 }, merge: { sent: 1.5, received: Number.NaN }, audit: 'lots', nope: { sent: 9, received: 9 }, data: { sent: 2 ** 60, received: 7 } });
    expect(t.activation).toEqual({ sent: 12, received: 0 });
    expect(t.merge).toEqual({ sent: 0, received: 0 });
    expect(t.audit).toEqual({ sent: 0, received: 0 });
    expect(t.data).toEqual({ sent: 0, received: 7 });
    expect(Object.keys(t)).toEqual([...TRAFFIC_KINDS]);
  });
});
