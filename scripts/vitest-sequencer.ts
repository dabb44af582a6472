import { BaseSequencer, type TestSpecification } from 'vitest/node';

/**
 * Vitest's order (failed first, then slowest by the last run's cache, else largest file first) with the named files
 * moved to the front, as matched by the end of their path. A fresh clone has no cache: a short file that trains for
 * minutes would otherwise start last among the light files and run on alone after them.
 */
export function startingWith(first: readonly string[]): typeof BaseSequencer {
  return class FirstSequencer extends BaseSequencer {
    override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
      const sorted = await super.sort(files);
      const rank = (s: TestSpecification): number => {
        const i = first.findIndex((f) => s.moduleId.endsWith(f));
        return i < 0 ? first.length : i;
      };
      return sorted.map((s, i) => ({ s, i })).sort((a, b) => rank(a.s) - rank(b.s) || a.i - b.i).map(({ s }) => s);
    }
  };
}
