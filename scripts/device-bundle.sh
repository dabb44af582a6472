#!/usr/bin/env bash
# Packs the GPU benchmarks for the lent GPU machine, which reaches no registry,
# has no Node and takes at most 64 MiB of carried files: esbuild bundles of
# bench/gpu.ts, the WASM backend's binaries, Dawn for Node (the `webgpu`
# package, linux-x64 only), the prepared 4096-token shards and this machine's
# node binary (an official build: it needs only glibc), in one tar.xz,
# .device/bundle.tar.xz (git-ignored: name .device in the run's carry).
# On the device (see docs/gpu.md), Python unpacks it (no xz there is assumed):
#   python3 -c "import tarfile; tarfile.open('.device/bundle.tar.xz').extractall('/tmp/tah')"
#   cd /tmp/tah && PATH=$PWD/bin:$PATH TAH_DATA_DIR=$PWD/data TAH_RESULTS_DIR=$OUT node gpu.mjs
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.device
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
[ -f data/sotu-brown-v1-bpe4096/manifest.json ] || npm run prepare-data -- --vocab 4096
rm -rf "$OUT"
mkdir -p "$OUT" "$STAGE/node_modules/webgpu/dist" "$STAGE/data" "$STAGE/bin"
bundle() {
  npx esbuild "$1" --bundle --platform=node --format=esm --target=node20 --outfile="$STAGE/$2" \
    --external:webgpu --log-level=warning \
    --banner:js="import { createRequire as __tahRequire } from 'node:module'; import { fileURLToPath as __tahPath } from 'node:url'; import { dirname as __tahDir } from 'node:path'; const require = __tahRequire(import.meta.url); const __filename = __tahPath(import.meta.url); const __dirname = __tahDir(__filename);"
}
bundle bench/gpu.ts gpu.mjs
cp node_modules/@tensorflow/tfjs-backend-wasm/dist/*.wasm "$STAGE/"
cp node_modules/webgpu/index.js node_modules/webgpu/package.json "$STAGE/node_modules/webgpu/"
cp -r node_modules/webgpu/dist/linux-x64 "$STAGE/node_modules/webgpu/dist/"
cp -r data/sotu-brown-v1-bpe4096 "$STAGE/data/"
cp "$(readlink -f "$(command -v node)")" "$STAGE/bin/node"
tar -C "$STAGE" -cf - . | xz -T0 -6 > "$OUT/bundle.tar.xz"
du -sh "$STAGE" "$OUT/bundle.tar.xz"
