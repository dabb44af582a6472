import { PRESETS, stageSpecs, type PresetName, type RunLayout } from '@train-at-home/model';

/** The run's layout: operator configuration, fixed for the life of a run. */
export interface RunConfig extends RunLayout {
  name: string;
  preset: PresetName;
  /** Seeds the initial weights: every replica of a stage starts from the same ones. */
  seed: number;
  /** Every miner of the run uses these: microbatch size and the inner optimizer's schedule. */
  training: { batchSize: number; peakLr: number; warmupSteps: number; totalSteps: number; checkpointEvery: number };
}

/** What an operator may set: any field, and any part of the training settings. */
export type RunOverrides = Partial<Omit<RunConfig, 'training'>> & { training?: Partial<RunConfig['training']> };

export function defaultRunConfig(overrides: RunOverrides = {}): RunConfig {
  const preset = overrides.preset ?? 'small';
  const config: RunConfig = {
    name: 'default',
    preset,
    seed: 1,
    stages: 3,
    bottleneck: PRESETS[preset].dModel / 4,
    int8: true,
    ...overrides,
    training: {
      batchSize: preset === 'tiny' ? 32 : 16,
      peakLr: preset === 'tiny' ? 0.006 : 0.003,
      warmupSteps: 20,
      totalSteps: preset === 'tiny' ? 200 : 20_000,
      checkpointEvery: 20,
      ...overrides.training,
    },
  };
  stageSpecs(PRESETS[config.preset], config); // throws ConfigError on an impossible layout
  return config;
}
