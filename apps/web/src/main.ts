/**
 * The web entry. For now it shows that the model package runs unchanged in a
 * browser: it builds the `tiny` model's stages on the best backend the browser
 * offers and runs one microbatch through them. The Train at Home page (join,
 * train, earn) replaces this when the coordinator exists.
 */
import * as tf from '@tensorflow/tfjs';
import { LocalTrainer, PRESETS, countParameters, selectBackend } from '@train-at-home/model';

const status = document.getElementById('status')!;

async function main(): Promise<void> {
  const backend = await selectBackend(['webgl', 'cpu']);
  const config = PRESETS.tiny;
  const trainer = new LocalTrainer({ config, layout: { stages: 3, bottleneck: 32, int8: true }, seed: 1, peakLr: 1e-3, warmupSteps: 1, totalSteps: 1 });
  const batch = 2;
  const ids = Int32Array.from({ length: batch * config.contextLength }, (_, i) => (i * 7) % config.vocabSize);
  const loss = trainer.evaluate([{ batch, time: config.contextLength, inputs: ids, targets: ids }]);
  status.textContent = `tiny model: ${countParameters(config).toLocaleString()} parameters in 3 stages on ${backend}; loss of an untrained model ${loss.toFixed(3)} (ln V = ${Math.log(config.vocabSize).toFixed(3)}); tfjs ${tf.version.tfjs}`;
  status.dataset.loss = String(loss);
  trainer.dispose();
}

main().catch((e: unknown) => {
  status.textContent = `Could not start: ${(e as Error).message}`;
});
