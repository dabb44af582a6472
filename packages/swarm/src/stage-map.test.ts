import { PROTOCOL_VERSION, type StageView } from '@train-at-home/protocol';
import { describe, expect, it } from 'vitest';
import { StageMapView } from './stage-map';

const id = (n: number): string => n.toString(16).padStart(64, '0');
const delta = (stage: number, seq: number, joined: number[], left: number[] = []) => ({ v: PROTOCOL_VERSION, stage, seq, joined: joined.map(id), left: left.map(id) });

describe('StageMapView', () => {
  it('applies deltas in order, ignores stale ones, and tells of miners gone from every stage it talks to', () => {
    const left: string[][] = [];
    let changes = 0;
    const view = new StageMapView(async () => [], { onLeft: (ids) => left.push(ids), onChange: () => changes++ });
    view.snapshot({ v: PROTOCOL_VERSION, stages: [{ stage: 0, seq: 3, miners: [id(5), id(1)] }, { stage: 1, seq: 7, miners: [id(2)] }] });
    expect(view.peers(0)).toEqual([id(1), id(5)]);
    view.delta(delta(0, 4, [3, 9, 0]));
    expect(view.peers(0)).toEqual([0, 1, 3, 5, 9].map(id));
    view.delta(delta(0, 4, [7])); // stale: already had 4
    view.delta(delta(2, 1, [8])); // a stage it does not talk to
    expect(view.peers(0)).toEqual([0, 1, 3, 5, 9].map(id));
    expect(view.peers(2)).toEqual([]);
    // Miner 2 moves from stage 1 to stage 0 (stage 0's delta comes first): it left stage 1 but is still in view.
    view.delta(delta(0, 5, [2], [5]));
    view.delta(delta(1, 8, [], [2]));
    expect(left).toEqual([[id(5)]]);
    expect(view.seq(0)).toBe(5);
    expect(view.refetches).toBe(0);
    expect(changes).toBe(4); // the snapshot and three deltas applied
    // Malformed messages change nothing.
    view.delta({ ...delta(0, 6, [4]), joined: ['not an id'] });
    view.snapshot({ stages: [{ stage: -1, seq: 0, miners: [] }] });
    expect(view.peers(0)).toEqual([0, 1, 2, 3, 9].map(id));
  });

  it('fetches a stage again when a delta skips a number, then applies what came meanwhile', async () => {
    let answer!: (v: StageView[]) => void;
    const asked: number[][] = [];
    const view = new StageMapView((stages) => {
      asked.push(stages);
      return new Promise((resolve) => (answer = resolve));
    });
    view.snapshot({ v: PROTOCOL_VERSION, stages: [{ stage: 1, seq: 1, miners: [id(1)] }] });
    view.delta(delta(1, 3, [3])); // 2 was missed
    view.delta(delta(1, 5, [5])); // arrives during the fetch
    view.delta(delta(1, 4, [4], [1]));
    expect(asked).toEqual([[1]]);
    expect(view.peers(1)).toEqual([id(1)]);
    answer([{ stage: 1, seq: 3, miners: [id(1), id(2), id(3)] }]);
    await expect.poll(() => view.seq(1)).toBe(5);
    expect(view.peers(1)).toEqual([2, 3, 4, 5].map(id));
    expect(view.refetches).toBe(1);
  });

  it('asks again when the fetch after a missed change fails, until it gets the stage', async () => {
    let calls = 0;
    const view = new StageMapView(async () => {
      calls++;
      if (calls < 3) throw new Error('GET /api/stage-map: 429');
      return [{ stage: 0, seq: 4, miners: [id(1), id(4)] }];
    });
    view.snapshot({ v: PROTOCOL_VERSION, stages: [{ stage: 0, seq: 1, miners: [id(1)] }] });
    view.delta(delta(0, 3, [3])); // 2 was missed; no later change comes
    await expect.poll(() => view.seq(0), { timeout: 5000 }).toBe(4);
    expect(calls).toBe(3);
    expect(view.peers(0)).toEqual([id(1), id(4)]);
    // A stopped view stops asking.
    const stopped = new StageMapView(async () => {
      throw new Error('down');
    });
    stopped.snapshot({ v: PROTOCOL_VERSION, stages: [{ stage: 0, seq: 1, miners: [] }] });
    stopped.delta(delta(0, 3, [3]));
    stopped.close();
    await new Promise((r) => setTimeout(r, 700));
    expect(stopped.peers(0)).toEqual([]);
  });
});
