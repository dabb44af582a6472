import { PRESETS, boundaryCodec } from '@train-at-home/model';
import { describe, expect, it } from 'vitest';
import { SMALL_BOUNDARY, defaultRunConfig } from '../src/run-config';

describe('the default run layout', () => {
  it('is the compression frontier’s choice on small, both directions', () => {
    const run = defaultRunConfig();
    expect(run.preset).toBe('small');
    expect({ bottleneck: run.bottleneck, codec: boundaryCodec(run) }).toEqual({ bottleneck: SMALL_BOUNDARY.bottleneck, codec: SMALL_BOUNDARY.codec });
    expect(defaultRunConfig({ stages: 2 }).codec).toBe(SMALL_BOUNDARY.codec);
  });

  it('leaves a boundary the operator names alone, and other presets at a quarter width in int8', () => {
    const named = defaultRunConfig({ bottleneck: 64 });
    expect({ bottleneck: named.bottleneck, codec: boundaryCodec(named) }).toEqual({ bottleneck: 64, codec: 'int8' });
    expect(boundaryCodec(defaultRunConfig({ int8: false }))).toBe('fp32');
    const tiny = defaultRunConfig({ preset: 'tiny' });
    expect({ bottleneck: tiny.bottleneck, codec: boundaryCodec(tiny) }).toEqual({ bottleneck: PRESETS.tiny.dModel / 4, codec: 'int8' });
  });
});
