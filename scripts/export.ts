/**
 * `npm run export -- [--round N] [--coordinator URL] --out DIR`: the model a run trained, as a folder other tools
 * load (config.json, model.safetensors, tokenizer.json, onnx/model.onnx, README.md: server/src/model-export.ts).
 * It asks the coordinator for it (GET /api/model, the Dashboard's Download button), which assembles the agreed
 * weights of every stage at merge round N (default: the latest round every stage holds) and checks each against
 * the round's agreed hash. The coordinator owns the run's database (an embedded one is one process's only), so
 * the export goes through it: start it with `npm start` if it is not running.
 */
import { existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { unzipSync } from 'fflate';

const { values } = parseArgs({
  options: {
    round: { type: 'string' },
    coordinator: { type: 'string', default: `http://127.0.0.1:${process.env.PORT ?? '8080'}` },
    out: { type: 'string' },
  },
});
const fail = (message: string): never => {
  console.error(`export: ${message}`);
  process.exit(1);
};
if (!values.out) fail('say where to write the model: --out DIR');
if (values.round !== undefined && !/^(?:0|[1-9][0-9]{0,9})$/.test(values.round)) fail(`--round must be a merge round (an integer), not ${values.round}`);
const out = resolve(values.out!);
if (existsSync(out) && readdirSync(out).length > 0) fail(`${out} is not empty: name a new folder`);

const url = `${values.coordinator!.replace(/\/$/, '')}/api/model${values.round === undefined ? '' : `?round=${values.round}`}`;
let res: Response;
try {
  res = await fetch(url);
} catch (e) {
  fail(`cannot reach the coordinator at ${values.coordinator} (${(e as Error).message}); start it (npm start) or name it with --coordinator URL`);
}
if (!res!.ok) {
  const body = (await res!.json().catch(() => ({}))) as { error?: string; message?: string };
  fail(`${res!.status} ${body.error ?? ''}: ${body.message ?? res!.statusText}`);
}
const files = unzipSync(new Uint8Array(await res!.arrayBuffer()));
let bytes = 0;
for (const [path, data] of Object.entries(files)) {
  if (path.endsWith('/')) continue;
  // The archive holds one folder, <run>-round-<N>/: its contents go into --out.
  const inner = path.split('/').slice(1).join('/');
  if (!inner || inner.split('/').some((p) => p === '..' || p === '')) fail(`the archive holds an unexpected path ${path}`);
  mkdirSync(dirname(join(out, inner)), { recursive: true });
  writeFileSync(join(out, inner), data);
  bytes += data.length;
}
console.log(`export: round ${res!.headers.get('x-round')} of ${values.coordinator} written to ${out} (${Object.keys(files).length} files, ${(bytes / 1e6).toFixed(1)} MB)`);
