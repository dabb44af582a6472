import madge from 'madge';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const SERVER = fileURLToPath(new URL('.', import.meta.url));

describe("the server's imports", () => {
  it('run one way: no module imports, however indirectly, one that imports it (type imports included)', async () => {
    const graph = await madge(SERVER, {
      fileExtensions: ['ts'],
      excludeRegExp: [/\.test\.ts$/],
      tsConfig: fileURLToPath(new URL('../../tsconfig.json', import.meta.url)),
      detectiveOptions: { ts: { skipTypeImports: false }, es6: { skipTypeImports: false } },
    });
    // The graph is the server's own: a madge that saw nothing would find no cycle either.
    expect(Object.keys(graph.obj())).toEqual(expect.arrayContaining(['app.ts', 'coordinator.ts', 'phases.ts', 'socket/registration.ts', 'validator/flags.ts', 'scale-out.ts', 'run-state.ts']));
    expect(graph.obj()['phases.ts']).toContain('run-state.ts');
    expect(graph.circular()).toEqual([]);
  });
});
