/**
 * The coordinator's command line: embedded PGlite under ./db/coordinator (outside ./data, which is served)
 * by default, a PostgreSQL server when DATABASE_URL is set.
 *   npm run coordinator -- --port 8080 --preset small --stages 3
 * --bottleneck b and --codec (codec.ts: fp32, int8, q<bits>g<group>[z]) set the
 * boundaries; by default `small` uses SMALL_BOUNDARY (run-config.ts), others d/4 int8.
 * --domain (or TAH_DOMAIN) is what wallets sign for in payout links and claims:
 * the host name people open (train.example.org); by default localhost:PORT.
 * --local-miners N (or TAH_LOCAL_MINERS): while someone else is in the run and a
 * stage has nobody, start up to N headless miners on this machine to fill it
 * (local-miners.ts); by default one per stage, so one tab alone trains.
 * A hosted coordinator, whose stages are held by its visitors, sets 0.
 * A new run with local miners settles an emission epoch every two minutes
 * (LOCAL_INCENTIVES); with --local-miners 0, every hour (DEFAULT_INCENTIVES).
 * --stun URL,… and --turn URL,… (or TAH_STUN, TAH_TURN) name the STUN and TURN
 * servers miners use (none by default: no public server); TAH_TURN_SECRET is
 * coturn's static-auth-secret, from which per-miner credentials are minted
 * (network.ts; README, "TURN"). --relay on|off (TAH_RELAY): the coordinator's
 * own frame relay, capped per miner; off by default with --local-miners 0.
 * Limits and timings (operator-settings.ts; or the TAH_… variables named there):
 * --max-connections-per-ip N, --requests-per-ip-per-minute N,
 * --socket-rates event=max/ms,…, --heartbeat-ms N, --silent-ms N, --trust-proxy addr,…
 * (the load balancers in front: clients are those they forward), --evaluate-seconds N (held-out loss at most this
 * often: 30 s, or LOCAL_EVALUATE_EVERY_MS with local miners).
 * The emission clock and audit rates of a new run (operator-settings.ts; or TAH_EPOCH_SECONDS, …):
 * --epoch-seconds N, --settle-after-seconds N, --hold-epochs N, --audit-rate P, --unproven-audit-rate P.
 * --data DIR (or TAH_DATA): a new run trains on the dataset prepared there (prepare-data --input … --name NAME), served
 * from its folder's parent; its vocabulary must be the preset's. By default, the shipped corpora's under ./data.
 * DATABASE_URL and REDIS_URL together: scale-out mode, several processes serving one run
 * behind a load balancer (scale-out.ts; README, "Scale-out").
 * What the operator reads: start-up lines with the address to open, a status line every --status-seconds N
 * (TAH_STATUS_SECONDS; 60, 0 for none), and a line when it stopped (operator-status.ts). The JSON log beside them
 * is at --log-level (LOG_LEVEL): warn by default; info adds a line per HTTP request, debug and trace more.
 * --tls-cert FILE and --tls-key FILE (TAH_TLS_CERT, TAH_TLS_KEY): serve HTTPS (PEM certificate and key). Browsers
 * give WebGPU only to secure contexts: people who open the run at any address but localhost need it (README, "HTTPS").
 */
import { existsSync, readFileSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { DATASET_NAME, PRESETS, type DataManifest, type PresetName, type Precision } from '@train-at-home/model';
import { DATA_DIR } from '@train-at-home/model/node';
import { buildApp } from './app';
import { startupLines, statusLine } from './operator-status';
import { loopbackDoor } from './tls-loopback';
import { LOCAL_EVALUATE_EVERY_MS, LOCAL_INCENTIVES } from './run-config';
import { INCENTIVE_FLAGS, OPERATOR_FLAGS, SettingError, incentiveSettings, operatorSettings } from './operator-settings';

const { values } = parseArgs({
  options: {
    port: { type: 'string', default: process.env.PORT ?? '8080' },
    host: { type: 'string', default: process.env.HOST ?? '0.0.0.0' },
    preset: { type: 'string', default: 'small' },
    stages: { type: 'string', default: '3' },
    bottleneck: { type: 'string' },
    codec: { type: 'string' },
    run: { type: 'string', default: 'default' },
    domain: { type: 'string', default: process.env.TAH_DOMAIN },
    'local-miners': { type: 'string', default: process.env.TAH_LOCAL_MINERS ?? 'auto' },
    stun: { type: 'string', default: process.env.TAH_STUN ?? '' },
    turn: { type: 'string', default: process.env.TAH_TURN ?? '' },
    relay: { type: 'string', default: process.env.TAH_RELAY },
    'data-dir': { type: 'string', default: fileURLToPath(new URL('../../db/coordinator', import.meta.url)) },
    // A prepared dataset's folder (prepare-data --input … --name NAME writes data/NAME-v1-bpe<V>): what a new run trains on.
    data: { type: 'string', default: process.env.TAH_DATA },
    'max-connections-per-ip': { type: 'string', default: process.env[OPERATOR_FLAGS['max-connections-per-ip']] },
    'requests-per-ip-per-minute': { type: 'string', default: process.env[OPERATOR_FLAGS['requests-per-ip-per-minute']] },
    'socket-rates': { type: 'string', default: process.env[OPERATOR_FLAGS['socket-rates']] },
    'heartbeat-ms': { type: 'string', default: process.env[OPERATOR_FLAGS['heartbeat-ms']] },
    'silent-ms': { type: 'string', default: process.env[OPERATOR_FLAGS['silent-ms']] },
    'trust-proxy': { type: 'string', default: process.env[OPERATOR_FLAGS['trust-proxy']] },
    'evaluate-seconds': { type: 'string', default: process.env[OPERATOR_FLAGS['evaluate-seconds']] },
    'epoch-seconds': { type: 'string', default: process.env[INCENTIVE_FLAGS['epoch-seconds']] },
    'settle-after-seconds': { type: 'string', default: process.env[INCENTIVE_FLAGS['settle-after-seconds']] },
    'hold-epochs': { type: 'string', default: process.env[INCENTIVE_FLAGS['hold-epochs']] },
    'audit-rate': { type: 'string', default: process.env[INCENTIVE_FLAGS['audit-rate']] },
    'unproven-audit-rate': { type: 'string', default: process.env[INCENTIVE_FLAGS['unproven-audit-rate']] },
    'tls-cert': { type: 'string', default: process.env.TAH_TLS_CERT || undefined },
    'tls-key': { type: 'string', default: process.env.TAH_TLS_KEY || undefined },
    'log-level': { type: 'string', default: process.env.LOG_LEVEL || 'warn' },
    'status-seconds': { type: 'string', default: process.env.TAH_STATUS_SECONDS || '60' },
  },
});

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];
const logLevel = values['log-level']!;
if (!LOG_LEVELS.includes(logLevel)) {
  console.error(`--log-level must be one of ${LOG_LEVELS.join(', ')}, not ${logLevel}`);
  process.exit(2);
}
// HTTPS: a certificate and its key (PEM files), both or neither.
let tls: { cert: Buffer; key: Buffer } | undefined;
if (values['tls-cert'] !== undefined || values['tls-key'] !== undefined) {
  if (values['tls-cert'] === undefined || values['tls-key'] === undefined) {
    console.error('--tls-cert and --tls-key go together: the certificate (PEM) and its private key (PEM)');
    process.exit(2);
  }
  try {
    tls = { cert: readFileSync(values['tls-cert']), key: readFileSync(values['tls-key']) };
  } catch (e) {
    console.error(`--tls-cert/--tls-key: cannot read ${(e as NodeJS.ErrnoException).path ?? 'the files'} (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
    process.exit(2);
  }
}
const statusSeconds = Number(values['status-seconds']);
if (!Number.isSafeInteger(statusSeconds) || statusSeconds < 0) {
  console.error(`--status-seconds must be a whole number of seconds (0: no status lines), not ${values['status-seconds']}`);
  process.exit(2);
}

let operator: ReturnType<typeof operatorSettings>;
let incentives: ReturnType<typeof incentiveSettings>;
try {
  incentives = incentiveSettings({
    epochSeconds: values['epoch-seconds'],
    settleAfterSeconds: values['settle-after-seconds'],
    holdEpochs: values['hold-epochs'],
    auditRate: values['audit-rate'],
    unprovenAuditRate: values['unproven-audit-rate'],
  });
  operator = operatorSettings({
    maxConnectionsPerIp: values['max-connections-per-ip'],
    requestsPerIpPerMinute: values['requests-per-ip-per-minute'],
    socketRates: values['socket-rates'],
    heartbeatMs: values['heartbeat-ms'],
    silentMs: values['silent-ms'],
    trustProxy: values['trust-proxy'],
    evaluateSeconds: values['evaluate-seconds'],
  });
} catch (e) {
  if (!(e instanceof SettingError)) throw e;
  console.error(`--${e.message}`);
  process.exit(2);
}

const localMiners = values['local-miners'] === 'auto' ? 'auto' : Number(values['local-miners']);
if (localMiners !== 'auto' && (!Number.isSafeInteger(localMiners) || localMiners < 0)) {
  console.error(`--local-miners must be a whole number or auto, not ${values['local-miners']}`);
  process.exit(2);
}

if (values.relay !== undefined && values.relay !== 'on' && values.relay !== 'off') {
  console.error(`--relay must be on or off, not ${values.relay}`);
  process.exit(2);
}
// The dataset: the shipped corpora's under ./data, or the operator's own (--data), checked before anything starts.
let dataRoot = DATA_DIR;
let dataset: string | undefined;
if (values.data) {
  const dir = resolve(values.data);
  const manifestFile = join(dir, 'manifest.json');
  if (!DATASET_NAME.test(basename(dir)) || !existsSync(manifestFile)) {
    console.error(`--data ${values.data}: not a prepared dataset (the folder prepare-data wrote, named NAME-v1-bpe<vocab>, holding its manifest.json)`);
    process.exit(2);
  }
  const manifest = JSON.parse(readFileSync(manifestFile, 'utf8')) as DataManifest;
  const vocabSize = PRESETS[values.preset as PresetName]?.vocabSize;
  if (manifest.vocabSize !== vocabSize) {
    console.error(`--data ${values.data}: its tokenizer has ${manifest.vocabSize} tokens and the ${values.preset} preset's model ${vocabSize}: prepare it with --vocab ${vocabSize}`);
    process.exit(2);
  }
  dataRoot = dirname(dir);
  dataset = basename(dir);
}
const urls = (list: string): string[] => list.split(',').map((u) => u.trim()).filter(Boolean);

const starting = Date.now();
console.log(
  `Train at Home: starting the coordinator: run "${values.run}", ` +
    `${process.env.DATABASE_URL ? 'the PostgreSQL server at DATABASE_URL' : `the embedded database in ${values['data-dir']}`}, then the validator (seconds)…`,
);
const app = await buildApp({
  // On one's own machine the validator shares the cores the tab and local miners train on: held-out loss less often.
  ...(localMiners !== 0 ? { evaluateEveryMs: LOCAL_EVALUATE_EVERY_MS } : {}),
  ...operator,
  logger: { level: logLevel },
  ...(tls ? { tls } : {}),
  webRoot: fileURLToPath(new URL('../../dist/web', import.meta.url)),
  dataRoot,
  run: {
    name: values.run,
    ...(dataset ? { dataset } : {}),
    preset: values.preset as PresetName,
    stages: Number(values.stages),
    ...(values.bottleneck ? { bottleneck: Number(values.bottleneck) } : {}),
    ...(values.codec ? { codec: values.codec as Precision } : {}),
    // One person on their own machine sees a settled epoch in minutes; a hosted run keeps hour-long epochs.
    // The operator's emission clock and audit rates, if given, over either.
    incentives: { ...(localMiners !== 0 ? LOCAL_INCENTIVES : {}), ...incentives },
  },
  rewards: { domain: values.domain ?? `localhost:${values.port}` },
  network: {
    stun: urls(values.stun),
    turn: urls(values.turn),
    turnSecret: process.env.TAH_TURN_SECRET || undefined,
    // A hosted run's pairs connect directly or through TURN; the relay is for a run on one's own machine.
    relay: { enabled: values.relay === undefined ? localMiners !== 0 : values.relay === 'on', bytesPerMinute: 64 * 1024 * 1024 },
  },
  database: process.env.DATABASE_URL ? { url: process.env.DATABASE_URL } : { dataDir: values['data-dir'] },
  // Scale-out mode: any number of processes, each with the same DATABASE_URL and REDIS_URL (README.md, "Scale-out").
  ...(process.env.REDIS_URL ? { redisUrl: process.env.REDIS_URL } : {}),
  // Beside the database: a restart on this machine takes over the local miners still running.
  // (With DATABASE_URL there is no such folder of ours: a restart starts new local miners.)
  ...(process.env.DATABASE_URL ? {} : { localMiners: { stateFile: join(values['data-dir'], 'local-miners.json') } }),
});
// A run's dataset never changes under its miners: the stored run's wins, and a different one asked for is refused.
if (values.data && app.coordinator.run.dataset !== dataset) {
  console.error(`--data ${values.data}: the stored run "${values.run}" trains on ${app.coordinator.run.dataset ?? 'the shipped corpora'}; start another run for this dataset (--run NAME)`);
  await app.close();
  process.exit(2);
}
await app.fastify.listen({ port: Number(values.port), host: values.host });
// Local miners reach this coordinator on this machine.
const { port } = app.fastify.server.address() as { port: number };
console.log(`Train at Home: ready in ${((Date.now() - starting) / 1000).toFixed(1)} s.`);
for (const line of startupLines(app, values.host!, port, statusSeconds, tls ? 'https' : 'http')) console.log(line);
const status =
  statusSeconds > 0
    ? setInterval(() => {
        statusLine(app, statusSeconds * 1000).then(
          (line) => console.log(line),
          (e: unknown) => console.log(`status: not read (${(e as Error).message})`),
        );
      }, statusSeconds * 1000)
    : undefined;
status?.unref();
// By default one per stage of the run (the stored run's layout wins over --stages).
// Over HTTPS they come in through a plain door on 127.0.0.1, which no certificate names (tls-loopback.ts).
const ownHost = values.host === '0.0.0.0' || values.host === '::' ? '127.0.0.1' : values.host!;
const door = tls ? await loopbackDoor(ownHost, port, tls.cert) : undefined;
app.localMiners.start(door?.url ?? `http://${ownHost}:${port}`, localMiners === 'auto' ? app.coordinator.run.stages : localMiners);
// npm's scripts start this file as `node --import tsx`, not with the tsx CLI: that one relays a signal to its child
// and SIGKILLs it when the child has not acknowledged it within ~60 ms, which a loaded coordinator missed, killed
// mid-shutdown (its local miners' record torn, so the restarted one started new miners beside them).
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    clearInterval(status);
    console.log(`Train at Home: stopping (${signal})…`);
    // Local miners stay: restarted within three minutes, this coordinator takes them over with their
    // weights and peers (local-miners.ts); otherwise they leave on their own.
    Promise.all([app.close({ keepLocalMiners: true }), door?.close()]).then(
      () => {
        console.log(`Train at Home: stopped. The run's state is kept; start it again to go on${app.localMiners.running ? ' (its local miners wait three minutes to be taken over)' : ''}.`);
        process.exit(0);
      },
      (e: unknown) => {
        console.error(`Train at Home: stopped, with an error while closing: ${(e as Error).message}`);
        process.exit(1);
      },
    );
  });
}
