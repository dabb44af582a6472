import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

/**
 * Node flags for a child process that runs one of our TypeScript files
 * (the PGlite init child, local miners). `--import tsx` names a package,
 * which Node resolves from the child's working directory: a coordinator
 * started from another folder (a service manager's) had children that could
 * not find it and crashed. Resolved here, from this file, the loader is found
 * wherever the process runs.
 */
export function tsxExecArgv(): string[] {
  // Resolved when a child is started, not on import: a bundled coordinator (bench:gpu-swarm's, on the GPU
  // machine) ships no tsx and starts only bundled children.
  return ['--import', pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href];
}
