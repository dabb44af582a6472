#!/usr/bin/env bash
# Packs `npm run bench:gpu` for the lent GPU machine, which reaches no registry
# and takes at most 64 MiB of carried files: one bundled script (esbuild), the
# WASM backend's binaries, Dawn for Node (the `webgpu` package, linux-x64
# only) and the prepared 4096-token shards, in ./.device (git-ignored: name it in the run's carry).
# On the device (see docs/gpu.md):
#   cd .device && TAH_DATA_DIR=$PWD/data TAH_RESULTS_DIR=$OUT node gpu.mjs
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.device
[ -f data/sotu-brown-v1-bpe4096/manifest.json ] || npm run prepare-data -- --vocab 4096
rm -rf "$OUT"
mkdir -p "$OUT/node_modules/webgpu/dist" "$OUT/data"
npx esbuild bench/gpu.ts --bundle --platform=node --format=esm --target=node20 --outfile="$OUT/gpu.mjs" \
  --external:webgpu --log-level=warning \
  --banner:js="import { createRequire as __tahRequire } from 'node:module'; import { fileURLToPath as __tahPath } from 'node:url'; import { dirname as __tahDir } from 'node:path'; const require = __tahRequire(import.meta.url); const __filename = __tahPath(import.meta.url); const __dirname = __tahDir(__filename);"
cp node_modules/@tensorflow/tfjs-backend-wasm/dist/*.wasm "$OUT/"
cp node_modules/webgpu/index.js node_modules/webgpu/package.json "$OUT/node_modules/webgpu/"
cp -r node_modules/webgpu/dist/linux-x64 "$OUT/node_modules/webgpu/dist/"
cp -r data/sotu-brown-v1-bpe4096 "$OUT/data/"
du -sh "$OUT"
