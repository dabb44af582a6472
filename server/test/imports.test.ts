import madge from 'madge';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const SERVER = join(ROOT, 'server/src');
const TESTKIT = join(ROOT, 'testkit/src');
const TSCONFIG = join(ROOT, 'tsconfig.json');
const madgeOptions = {
  fileExtensions: ['ts'],
  excludeRegExp: [/\.test\.ts$/],
  tsConfig: TSCONFIG,
  detectiveOptions: { ts: { skipTypeImports: false }, es6: { skipTypeImports: false } },
};

describe("the server's imports", () => {
  it('run one way: no module imports, however indirectly, one that imports it (type imports included)', async () => {
    const graph = await madge(SERVER, madgeOptions);
    // The graph is the server's own: a madge that saw nothing would find no cycle either.
    expect(Object.keys(graph.obj())).toEqual(expect.arrayContaining(['app.ts', 'coordinator.ts', 'phases.ts', 'socket/registration.ts', 'state/flags.ts', 'scale-out.ts', 'run-state.ts']));
    expect(graph.obj()['phases.ts']).toContain('run-state.ts');
    expect(graph.circular()).toEqual([]);
  });

  it("and so do the test kit's (the fixtures that lived in server/src until they moved out)", async () => {
    const graph = await madge(TESTKIT, madgeOptions);
    expect(Object.keys(graph.obj())).toEqual(expect.arrayContaining(['miner-processes.ts', 'coordinator.ts', 'database.ts', 'swarm.ts', 'nat-lab.ts', 'sim-harness.ts']));
    expect(graph.obj()['miner-processes.ts']).toContain('coordinator.ts');
    expect(graph.circular()).toEqual([]);
  });
});

/** Every TypeScript file under the product's source folders: server/src, packages/x/src, apps/x/src. */
function productFiles(): string[] {
  const roots = [SERVER];
  for (const group of ['packages', 'apps']) {
    for (const entry of readdirSync(join(ROOT, group), { withFileTypes: true })) if (entry.isDirectory()) roots.push(join(ROOT, group, entry.name, 'src'));
  }
  return roots.flatMap((root) =>
    (readdirSync(root, { recursive: true, withFileTypes: true }) as Array<{ name: string; parentPath: string; isFile(): boolean }>)
      .filter((e) => e.isFile() && /\.tsx?$/.test(e.name))
      .map((e) => join(e.parentPath, e.name)),
  );
}

/** What a file imports or re-exports: `import … from 'x'`, `export … from 'x'`, `import 'x'`, `import('x')`. */
const IMPORT = /(?:^|[\s;}])(?:import|export)\b[^'"`;]*?\bfrom\s*['"]([^'"]+)['"]|\bimport\s*\(?\s*['"]([^'"]+)['"]/gm;
const specifiersOf = (text: string): string[] => [...text.matchAll(IMPORT)].map((m) => (m[1] ?? m[2])!);
const specifiers = (file: string): string[] => specifiersOf(readFileSync(file, 'utf8'));

const isTest = (file: string): boolean => /\.test\.tsx?$/.test(file);
const isVitest = (spec: string): boolean => /^(?:vitest|@vitest\/[^/]+)(?:\/|$)/.test(spec);
const isTestkitPackage = (spec: string): boolean => /^@train-at-home\/testkit(?:\/|$)/.test(spec);
/** Named like a fixture: test-x.ts, test_x.ts, x.fixture.ts, or inside a testing/, fixtures/, __mocks__/ or __tests__/ folder. */
const fixtureName = (path: string): boolean =>
  /(?:^|\/)(?:testing|fixtures?|__mocks__|__tests__)\//.test(path) || /(?:^|\/)test[-_][^/]*\.tsx?$/.test(path) || /\.fixtures?\.tsx?$/.test(path);

/** A relative or absolute path that lands in testkit/ (the package's name is how a test reaches it). */
const intoTestkit = (file: string, spec: string): boolean => /^\.{1,2}(?:\/|$)|^\//.test(spec) && (resolve(dirname(file), spec) + sep).startsWith(join(ROOT, 'testkit') + sep);

describe('the product holds no test fixture', () => {
  const files = productFiles();
  const rel = (f: string): string => relative(ROOT, f).split(sep).join('/');

  it('no source file of server/src, packages/*/src or apps/*/src but a test imports vitest or the test kit, or is named like a fixture', () => {
    // The walk saw the product: one that found nothing would find no fixture either.
    expect(files.map(rel)).toEqual(expect.arrayContaining(['server/src/app.ts', 'server/src/db/database.ts', 'packages/incentives/src/index.ts', 'packages/swarm/src/miner.ts', 'apps/miner/src/main.ts']));
    expect(files.map(rel)).toEqual(expect.arrayContaining([expect.stringMatching(/^apps\/web\/src\/.*\.tsx$/)]));
    const found = files
      .filter((f) => !isTest(f))
      .flatMap((f) => [
        ...(fixtureName(rel(f)) ? [`${rel(f)}: named like a fixture`] : []),
        ...specifiers(f)
          .filter((s) => isVitest(s) || isTestkitPackage(s))
          .map((s) => `${rel(f)} imports ${s}`),
      ]);
    expect(found).toEqual([]);
  });

  it('no file under those folders, tests included, imports the test kit by a path into testkit/ (tests name @train-at-home/testkit)', () => {
    const found = files.flatMap((f) => specifiers(f).filter((s) => intoTestkit(f, s)).map((s) => `${rel(f)} imports ${s}`));
    expect(found).toEqual([]);
  });

  it('the checks above see what they look for', () => {
    // A fixture, a vitest import and a path into testkit/, written the ways the product's files would write them.
    expect(['server/src/testing/x.ts', 'server/src/test-miners.ts', 'packages/incentives/src/test-util.ts', 'server/src/x.fixture.ts'].every(fixtureName)).toBe(true);
    expect(['server/src/app.ts', 'server/src/validator/process.ts', 'apps/web/src/tab/worker.ts'].some(fixtureName)).toBe(false);
    expect(specifiersOf("import { expect } from 'vitest';\nexport { a } from '@train-at-home/testkit/x';\nimport type {\n  B,\n} from '../../testkit/src/y';\nawait import('./z');")).toEqual(['vitest', '@train-at-home/testkit/x', '../../testkit/src/y', './z']);
    expect(['vitest', 'vitest/config', '@vitest/expect'].every(isVitest)).toBe(true);
    expect(['vitest-outcomes', '@train-at-home/model'].some(isVitest)).toBe(false);
    const test = join(SERVER, 'x.test.ts');
    expect(['../../testkit/src/y', '../../testkit', join(ROOT, 'testkit/src/y.ts')].every((s) => intoTestkit(test, s))).toBe(true);
    expect(['./testkit-like', '@train-at-home/testkit/y', '../../testkitten/y'].some((s) => intoTestkit(test, s))).toBe(false);
  });
});

/** The workspace packages each package's product files may import: the packages are the bottom layer, in this order. */
const PACKAGE_LAYERS: Record<string, string[]> = { protocol: [], model: [], incentives: [], swarm: ['protocol', 'model'] };
/** What the incentive rules may not touch: they are pure (no I/O, no tensors), the same functions in a tab and in Node. */
const IMPURE = /^(?:node:)?(?:fs|fs\/promises|net|http|https|http2|child_process|worker_threads|dgram|dns|tls)$|^@tensorflow\/|^socket\.io|^simple-peer$/;

/** The workspace package a specifier names (`@train-at-home/swarm/codec` → swarm), or where a relative path lands outside the file's own package. */
function layerOf(file: string, spec: string, own: string): string | undefined {
  const named = /^@train-at-home\/([^/]+)/.exec(spec);
  if (named) return named[1];
  if (!/^\.{1,2}(?:\/|$)/.test(spec)) return undefined;
  const target = relative(ROOT, resolve(dirname(file), spec)).split(sep).join('/');
  return target.startsWith(`packages/${own}/`) ? undefined : target.split('/').slice(0, target.startsWith('packages/') ? 2 : 1).join('/');
}

describe('the layers', () => {
  const rel = (f: string): string => relative(ROOT, f).split(sep).join('/');
  const packageFiles = productFiles().filter((f) => !isTest(f) && rel(f).startsWith('packages/'));

  it('packages import no server, app or test kit, and of each other only those below them; packages/incentives is pure', () => {
    expect(new Set(packageFiles.map((f) => rel(f).split('/')[1]))).toEqual(new Set(Object.keys(PACKAGE_LAYERS)));
    const found = packageFiles.flatMap((f) => {
      const own = rel(f).split('/')[1]!;
      return specifiers(f).flatMap((s) => {
        const layer = layerOf(f, s, own);
        const bad = (layer !== undefined && layer !== own && !PACKAGE_LAYERS[own]!.includes(layer)) || (own === 'incentives' && IMPURE.test(s));
        return bad ? [`${rel(f)} imports ${s}`] : [];
      });
    });
    expect(found).toEqual([]);
  });

  it("the server's ledger (money: settlements, claims, their nonces and errors) imports only the database layer below it: the rewards API sits above it", () => {
    const ledger = productFiles().filter((f) => !isTest(f) && rel(f).startsWith('server/src/ledger/'));
    expect(ledger.length).toBeGreaterThan(0);
    const found = ledger.flatMap((f) =>
      specifiers(f)
        .filter((s) => /^\.{1,2}\//.test(s))
        .map((s) => rel(resolve(dirname(f), s)))
        .filter((target) => !target.startsWith('server/src/ledger/') && !target.startsWith('server/src/db/'))
        .map((target) => `${rel(f)} imports ${target}`),
    );
    expect(found).toEqual([]);
  });

  it('the layer check sees what it looks for', () => {
    const swarm = join(ROOT, 'packages/swarm/src/miner.ts');
    expect(layerOf(swarm, '@train-at-home/model/node', 'swarm')).toBe('model');
    expect(layerOf(swarm, './allreduce/codec', 'swarm')).toBeUndefined();
    expect(layerOf(swarm, '../../../server/src/app', 'swarm')).toBe('server');
    expect(layerOf(swarm, '../../model/src/stage', 'swarm')).toBe('packages/model');
    expect(layerOf(swarm, '@tensorflow/tfjs', 'swarm')).toBeUndefined();
    expect(['node:fs', 'fs', 'node:http', '@tensorflow/tfjs', 'socket.io-client'].every((s) => IMPURE.test(s))).toBe(true);
    expect(['@noble/hashes/sha256', '@openzeppelin/merkle-tree', 'node:crypto-like'].some((s) => IMPURE.test(s))).toBe(false);
  });
});
