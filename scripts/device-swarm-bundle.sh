#!/usr/bin/env bash
# Packs bench/gpu-swarm.ts (a 3-stage swarm of Node miners training the `gpu`
# preset on WebGPU, coordinator and validator included) for the lent GPU
# machine, which reaches no registry, has no Node and takes at most 64 MiB of
# carried files, the way scripts/device-bundle.sh packs bench/gpu.ts:
#   gpu-swarm.mjs  the benchmark with the coordinator (esbuild bundle)
#   gpu.mjs        bench/gpu.ts (tokens/s per backend), so one carry holds both
#   miner.mjs      apps/miner/src/main.ts (the benchmark starts it: --count 3)
#   validator.mjs  server/src/validator/process.ts (the coordinator forks it)
#   *.wasm         the tfjs WASM backend's binaries (found next to the bundles)
#   node_modules/  what stays external: webgpu (Dawn, linux-x64), @roamhq/wrtc
#                  and its linux-x64 binary, @electric-sql/pglite (its runtime
#                  .js, .wasm and .data; no extension tarballs)
#   data/          the prepared shards of the `gpu` preset (bpe4096); with
#                  --with-tiny also `tiny`'s (bpe320, +4 MB packed), to try the
#                  same bundle on a CPU (--preset tiny --backend wasm)
#   bin/node       this machine's node (an official build: it needs only glibc)
# in one tar.xz (binaries stripped of symbol tables: 3 MB less packed),
# .device-swarm/bundle.tar.xz (git-ignored: name .device-swarm
# in the run's carry). On the device, Python unpacks it:
#   python3 -c "import tarfile; tarfile.open('.device-swarm/bundle.tar.xz').extractall('/tmp/tah')"
#   cd /tmp/tah && PATH=$PWD/bin:$PATH TAH_DATA_DIR=$PWD/data TAH_RESULTS_DIR=$OUT node gpu-swarm.mjs --seconds 480
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.device-swarm
TINY=0
[ "${1:-}" = "--with-tiny" ] && TINY=1
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
[ -f data/sotu-brown-v1-bpe4096/manifest.json ] || npm run prepare-data -- --vocab 4096
[ "$TINY" = 0 ] || [ -f data/sotu-brown-v1-bpe320/manifest.json ] || npm run prepare-data -- --vocab 320
rm -rf "$OUT"
mkdir -p "$OUT" "$STAGE/data" "$STAGE/bin" "$STAGE/node_modules/webgpu/dist" "$STAGE/node_modules/@roamhq" "$STAGE/node_modules/@electric-sql/pglite/dist/fs"
bundle() {
  npx esbuild "$1" --bundle --platform=node --format=esm --target=node20 --outfile="$STAGE/$2" \
    --external:webgpu --external:@roamhq/wrtc --external:@electric-sql/pglite \
    --external:pg-native --external:bufferutil --external:utf-8-validate --log-level=error \
    --banner:js="import { createRequire as __tahRequire } from 'node:module'; import { fileURLToPath as __tahPath } from 'node:url'; import { dirname as __tahDir } from 'node:path'; const require = __tahRequire(import.meta.url); const __filename = __tahPath(import.meta.url); const __dirname = __tahDir(__filename);"
}
bundle bench/gpu-swarm.ts gpu-swarm.mjs
bundle bench/gpu.ts gpu.mjs
bundle apps/miner/src/main.ts miner.mjs
bundle server/src/validator/process.ts validator.mjs
cp node_modules/@tensorflow/tfjs-backend-wasm/dist/*.wasm "$STAGE/"
# Dawn for Node: its loader and the linux-x64 binary only.
cp node_modules/webgpu/index.js node_modules/webgpu/package.json "$STAGE/node_modules/webgpu/"
cp -r node_modules/webgpu/dist/linux-x64 "$STAGE/node_modules/webgpu/dist/"
# WebRTC for the miners: the package's JS (it requires @roamhq/wrtc-linux-x64 by name) and that binary.
mkdir -p "$STAGE/node_modules/@roamhq/wrtc"
cp -r node_modules/@roamhq/wrtc/package.json node_modules/@roamhq/wrtc/lib "$STAGE/node_modules/@roamhq/wrtc/"
cp -r node_modules/@roamhq/wrtc-linux-x64 "$STAGE/node_modules/@roamhq/"
strip --strip-all "$STAGE/node_modules/@roamhq/wrtc-linux-x64/wrtc.node" "$STAGE/node_modules/webgpu/dist/linux-x64/dawn.node"
# PGlite loads pglite.wasm, pglite.data and initdb.wasm next to its modules; extensions (contrib/, *.tar.gz) are not loaded.
PGL=node_modules/@electric-sql/pglite
cp "$PGL/package.json" "$STAGE/$PGL/"
cp "$PGL"/dist/*.js "$PGL"/dist/*.wasm "$PGL"/dist/*.data "$STAGE/$PGL/dist/"
cp "$PGL"/dist/fs/*.js "$STAGE/$PGL/dist/fs/" 2>/dev/null || true
cp -r data/sotu-brown-v1-bpe4096 "$STAGE/data/"
[ "$TINY" = 0 ] || cp -r data/sotu-brown-v1-bpe320 "$STAGE/data/"
cp "$(readlink -f "$(command -v node)")" "$STAGE/bin/node"
strip --strip-all "$STAGE/bin/node"
tar -C "$STAGE" --sort=name -cf - . | xz -T0 -6 > "$OUT/bundle.tar.xz"
du -sh "$STAGE" "$OUT/bundle.tar.xz"
echo "$(stat -c %s "$OUT/bundle.tar.xz") bytes packed"
