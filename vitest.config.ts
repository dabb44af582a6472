import { defineConfig } from 'vitest/config';
import { startingWith } from './scripts/vitest-sequencer';

const ALL = ['packages/*/src/**/*.test.ts', 'apps/*/src/**/*.test.ts', 'server/test/**/*.test.ts', 'bench/**/*.test.ts'];

/**
 * Files that want the machine to themselves: they start real miners, swarms or training runs (each wants a whole
 * core, and CI has two), or they judge the coordinator's deadlines against stalls they make themselves. They run
 * one at a time, after the light files (and the PAIRED ones, heavy files that mostly wait). Everything else is light (no miners, no training: requests, schemas, money,
 * pure functions) and runs two at a time first. A file's wall time is printed at the end of each pass
 * (scripts/vitest-outcomes.ts): one that has grown heavy belongs here.
 *
 * Two files train for minutes yet are light: packages/model/src/train.test.ts and packages/swarm/src/audit/audit.test.ts
 * compute in their own worker only (no miner processes, no coordinator, no deadline: a fixed number of steps, judged
 * by their outcome), so each keeps one core busy and the other worker runs the light files beside it, where alone
 * in the heavy project each held the whole machine with one core idle (243 s and 45 s of this machine's CI run).
 * They start first (LONG_LIGHT), so the other files fill the other core around them.
 *
 * The ledger's files (accounting, audits, settlement, rewards, operator-settings, validator) are light too: they write
 * work straight to the database and wait on the validator's clock, not on miners. validator.test.ts kept the machine
 * 84% idle for its 84 s alone in the heavy project (its epochs and the coordinator's 10 s wait for a microbatch's
 * announcement are wall time), and the same again in the PostgreSQL pass.
 */
const LONG_LIGHT = ['packages/model/src/train.test.ts', 'packages/swarm/src/audit/audit.test.ts'];
/**
 * Heavy files that mostly wait (on merges, departures, restarts: alone, the machine's cores were 18-52% busy through
 * them in CI) and judge nothing against a stall of their own making. They run two at a time, after the light files
 * and before the rest of the heavy ones: 118 s where one at a time took 230 s, every test passing. Not nat.test.ts,
 * though it waits too: paired with other heavy files it failed once (stop 53).
 */
const PAIRED = ['server/test/{rebalance,mesh,phases,registration,restart}.test.ts'];
const HEAVY = [
  'server/test/{adversarial,detectors,audit-deadline,own-corpus,liar,replicas,churn,centered-clip,pipeline,nat,checkpoint,operator-cli}.test.ts',
  'server/test/{stage-map,scale-out}.test.ts',
  'server/test/hardening/{fuzz,working-directory,idle-memory,slow-request}.test.ts',
];

export default defineConfig({
  test: {
    // Model tests train real networks on one CPU core: minutes, not milliseconds.
    testTimeout: 600_000,
    hookTimeout: 120_000,
    // The second names every file that did not pass as the run's last lines (CI keeps only its tail), and every file's wall time.
    reporters: ['default', './scripts/vitest-outcomes.ts'],
    sequence: { sequencer: startingWith(LONG_LIGHT) },
    projects: [
      { extends: true, test: { name: 'light', include: ALL, exclude: [...HEAVY, ...PAIRED], maxWorkers: 2, sequence: { groupOrder: 0 } } },
      { extends: true, test: { name: 'paired', include: PAIRED, maxWorkers: 2, sequence: { groupOrder: 1 } } },
      { extends: true, test: { name: 'heavy', include: HEAVY, fileParallelism: false, sequence: { groupOrder: 2 } } },
    ],
  },
});
