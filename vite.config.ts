import { defineConfig } from 'vite';

// The web app lives in apps/web; static files in public/; the build goes to dist/web,
// which the coordinator serves.
export default defineConfig({
  root: 'apps/web',
  publicDir: '../../public',
  build: {
    outDir: '../../dist/web',
    emptyOutDir: true,
    // tfjs is large; one chunk per entry is fine until the app splits its routes.
    chunkSizeWarningLimit: 4096,
  },
});
