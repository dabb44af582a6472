/**
 * Assembles the project's own WebAssembly kernels (packages/model/src/wasm/*.wat) into the TypeScript modules that
 * carry their bytes (base64), so the tab, the Node miner and the validator load the same kernel with no build step:
 *   npx tsx scripts/build-wasm-kernels.ts            writes packages/model/src/wasm/<name>-module.ts
 * packages/model/src/wasm/batch-matmul.test.ts checks the committed bytes are what this makes of the source.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { assembleKernel, KERNELS } from './wasm-kernels';

for (const name of KERNELS) {
  const wat = fileURLToPath(new URL(`../packages/model/src/wasm/${name}.wat`, import.meta.url));
  const out = fileURLToPath(new URL(`../packages/model/src/wasm/${name}-module.ts`, import.meta.url));
  writeFileSync(out, await assembleKernel(name, readFileSync(wat, 'utf8')));
  console.log(`wasm kernels: ${out}`);
}
