import { PRESETS, stageSpecs, type PresetName, type RunLayout } from '@train-at-home/model';

/** The run's layout: operator configuration, fixed for the life of a run. */
export interface RunConfig extends RunLayout {
  name: string;
  preset: PresetName;
}

export function defaultRunConfig(overrides: Partial<RunConfig> = {}): RunConfig {
  const preset = overrides.preset ?? 'small';
  const config: RunConfig = {
    name: 'default',
    preset,
    stages: 3,
    bottleneck: PRESETS[preset].dModel / 4,
    int8: true,
    ...overrides,
  };
  stageSpecs(PRESETS[config.preset], config); // throws ConfigError on an impossible layout
  return config;
}
