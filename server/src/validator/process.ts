/**
 * The validator's process, started by the coordinator (validator/client.ts):
 * every piece of model work (held-out loss, replays of sampled microbatches,
 * text samples) and the epoch's scoring run here, off the coordinator's event
 * loop. It holds no database and no socket: the coordinator hands it data
 * over the IPC channel and stores what comes back. Jobs run one at a time,
 * replays and scoring first.
 */
import type { RunConfig } from '../run-config';
import { ValidatorCompute, ValidatorError } from './compute';
import { scoreEpoch } from './scoring';
import { nextJob, type ValidatorJob } from './jobs';

const send = (m: unknown): void => void process.send?.(m);
const run = JSON.parse(process.env.TAH_VALIDATOR_RUN ?? 'null') as RunConfig | null;
if (!run || !process.send) {
  console.error('validator: start me through the coordinator (validator/client.ts)');
  process.exit(2);
}
const compute = new ValidatorCompute(run);
let queue: Promise<void> = compute.init().then(() => send({ ready: true }));

async function handle(job: ValidatorJob): Promise<unknown> {
  switch (job.kind) {
    case 'evaluate':
      return compute.evaluate(job.blobs);
    case 'generate':
      return compute.generate(job.blobs, job.prompt, job.maxTokens, job.temperature, job.seed);
    case 'replay':
      return compute.replay(job.replay);
    case 'audit':
      return compute.audit(job.audit);
    case 'score':
      return scoreEpoch(job.score);
    case 'has':
      return job.stages.map(({ stage, hash }) => compute.has(stage, hash));
    case 'sleep':
      // For tests: a job that takes a while (a validator killed mid-job).
      await new Promise((r) => setTimeout(r, job.ms));
      return { slept: job.ms };
  }
}

const waiting: Array<{ id: number; job: ValidatorJob }> = [];

async function runOne(): Promise<void> {
  const [m] = waiting.splice(nextJob(waiting.map((w) => w.job)), 1);
  if (!m) return;
  // The coordinator times a job from here (client.ts): waiting in this queue is not being wedged.
  send({ id: m.id, started: true });
  try {
    send({ id: m.id, ok: true, result: await handle(m.job) });
  } catch (e) {
    const code = e instanceof ValidatorError ? e.code : 'BAD_JOB';
    send({ id: m.id, ok: false, error: { code, message: (e as Error).message } });
  }
}

process.on('message', (m: { id: number; job: ValidatorJob }) => {
  waiting.push(m);
  queue = queue.then(runOne).catch(() => {});
});
// The coordinator went away: so does its validator.
process.on('disconnect', () => process.exit(0));
