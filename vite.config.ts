import react from '@vitejs/plugin-react';
import { createRequire } from 'node:module';
import { defineConfig } from 'vite';

const require = createRequire(import.meta.url);

// The web app lives in apps/web; static files in public/; the build goes to dist/web,
// which the coordinator serves.
export default defineConfig({
  root: 'apps/web',
  publicDir: '../../public',
  plugins: [react()],
  resolve: {
    alias: {
      // simple-peer's package entry needs Node's events/buffer/stream; its prebuilt browser bundle does not.
      'simple-peer': require.resolve('simple-peer/simplepeer.min.js'),
    },
  },
  // The tab's miner runs in a module worker (tfjs, socket.io, the swarm code).
  worker: { format: 'es' },
  build: {
    outDir: '../../dist/web',
    emptyOutDir: true,
    // tfjs is large: it lives in the worker and in the swarm chunk the page loads on Join (or for Rewards' client), not in the pages' entry.
    chunkSizeWarningLimit: 8192,
  },
});
