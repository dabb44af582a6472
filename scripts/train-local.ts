/**
 * Trains the model locally: all stages in this process, every boundary tensor
 * through the real codec, loss printed as it goes, held-out loss at the end.
 *   npm run train -- --preset small --stages 3 --bottleneck 64 --steps 2000
 *   … --codec q6g4z (a boundary codec of codec.ts; default int8, --fp32 for none)
 *   … --backend webgpu (WebGPU through Dawn; WASM when no adapter, saying why)
 */
import { parseArgs } from 'node:util';
import { PRESETS, type BackendName, type Precision, type PresetName } from '@train-at-home/model';
import { runLocalTraining } from '@train-at-home/model/node';

const { values } = parseArgs({
  options: {
    preset: { type: 'string', default: 'small' },
    stages: { type: 'string', default: '3' },
    bottleneck: { type: 'string' },
    fp32: { type: 'boolean', default: false },
    steps: { type: 'string', default: '2000' },
    batch: { type: 'string', default: '16' },
    lr: { type: 'string', default: '0.003' },
    warmup: { type: 'string' },
    'eval-every': { type: 'string', default: '100' },
    seed: { type: 'string', default: '1' },
    codec: { type: 'string' },
    backend: { type: 'string', default: 'wasm' },
  },
});
const preset = values.preset as PresetName;
if (!(preset in PRESETS)) throw new Error(`unknown preset ${preset}; presets: ${Object.keys(PRESETS).join(', ')}`);
const result = await runLocalTraining({
  preset,
  stages: Number(values.stages),
  bottleneck: values.bottleneck ? Number(values.bottleneck) : PRESETS[preset].dModel / 4,
  int8: !values.fp32,
  ...(values.codec ? { codec: values.codec as Precision } : {}),
  backend: values.backend as BackendName,
  steps: Number(values.steps),
  batchSize: Number(values.batch),
  peakLr: Number(values.lr),
  warmupSteps: values.warmup ? Number(values.warmup) : undefined,
  evalEvery: Number(values['eval-every']),
  seed: Number(values.seed),
  log: console.log,
});
console.log(
  JSON.stringify({
    heldOutLoss: result.heldOutLoss,
    bigramLoss: result.bigramLoss,
    tokensPerSec: Math.round(result.tokensPerSec),
    bytesPerTokenPerBoundary: (result.wire.forwardBytes + result.wire.backwardBytes) / result.wire.tokens / (result.layout.stages - 1 || 1),
    backend: result.backend,
  }),
);
