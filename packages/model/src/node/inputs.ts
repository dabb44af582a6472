import { readFileSync, statSync } from 'node:fs';
import { extname, relative, resolve } from 'node:path';
import { asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects, parquetSchema } from 'hyparquet';
import { globSync } from 'tinyglobby';
import type { Document } from './corpus';

/** What `prepare-data --input` reads: plain text, JSON lines with a text field, Parquet with a text column. */
export const INPUT_EXTENSIONS = ['.txt', '.jsonl', '.parquet'] as const;

/** An operator's corpus that cannot be prepared, named: nothing is written. */
export class InputError extends Error {
  override name = 'InputError';
  constructor(
    readonly code: 'NO_INPUT' | 'UNREADABLE' | 'UNSUPPORTED' | 'BAD_LINE' | 'EMPTY_FIELD' | 'NO_COLUMN' | 'TOO_SMALL' | 'BAD_TOKENIZER' | 'BAD_NAME',
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

/**
 * The files a list of inputs names: each a file, a folder (every file of a known extension under it) or a glob;
 * sorted by path, each once, so the same inputs always give the same documents in the same order.
 */
export function inputFiles(inputs: string[]): string[] {
  const files = new Set<string>();
  for (const input of inputs) {
    if (/[*?[\]{}]/.test(input)) {
      const matched = globSync(input, { absolute: true, onlyFiles: true });
      if (matched.length === 0) throw new InputError('NO_INPUT', `${input} matches no file`);
      for (const f of matched) files.add(resolve(f));
      continue;
    }
    let stat;
    try {
      stat = statSync(input);
    } catch (e) {
      throw new InputError('UNREADABLE', `${input}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
    }
    if (stat.isDirectory()) {
      const under = globSync(INPUT_EXTENSIONS.map((x) => `**/*${x}`), { cwd: input, absolute: true, onlyFiles: true });
      if (under.length === 0) throw new InputError('NO_INPUT', `${input} holds no ${INPUT_EXTENSIONS.join(', ')} file`);
      for (const f of under) files.add(resolve(f));
    } else files.add(resolve(input));
  }
  const sorted = [...files].sort();
  for (const f of sorted) {
    if (!(INPUT_EXTENSIONS as readonly string[]).includes(extname(f).toLowerCase())) throw new InputError('UNSUPPORTED', `${f}: read are ${INPUT_EXTENSIONS.join(', ')} files`);
  }
  if (sorted.length === 0) throw new InputError('NO_INPUT', 'no input file');
  return sorted;
}

/**
 * Every document of the input files, in order: a `.txt` file is one document; a `.jsonl` file one per line (its
 * `field`, a non-empty string); a `.parquet` file one per row (its `field` column, read with hyparquet). A document is
 * named by its file (relative to `base`) and its line or row. `progress` sees each file read.
 */
export async function readInputs(files: string[], options: { field: string; base?: string; progress?: (done: number, total: number) => void }): Promise<Document[]> {
  const docs: Document[] = [];
  const base = options.base ?? process.cwd();
  for (const [i, file] of files.entries()) {
    const name = relative(base, file) || file;
    const ext = extname(file).toLowerCase();
    if (ext === '.parquet') docs.push(...(await readParquet(file, name, options.field)));
    else {
      let text: string;
      try {
        text = readFileSync(file, 'utf8');
      } catch (e) {
        throw new InputError('UNREADABLE', `${name}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
      }
      if (ext === '.txt') {
        if (!text.trim()) throw new InputError('EMPTY_FIELD', `${name} is empty`);
        docs.push({ source: name, text: text.trim() });
      } else docs.push(...readJsonLines(text, name, options.field));
    }
    options.progress?.(i + 1, files.length);
  }
  return docs;
}

function readJsonLines(text: string, name: string, field: string): Document[] {
  const docs: Document[] = [];
  const lines = text.split('\n');
  for (const [i, line] of lines.entries()) {
    if (!line.trim()) continue;
    let row: unknown;
    try {
      row = JSON.parse(line);
    } catch {
      throw new InputError('BAD_LINE', `${name}:${i + 1} is not JSON`);
    }
    const value = row && typeof row === 'object' ? (row as Record<string, unknown>)[field] : undefined;
    if (typeof value !== 'string' || !value.trim()) throw new InputError('EMPTY_FIELD', `${name}:${i + 1} has no text in its field "${field}"`);
    docs.push({ source: `${name}:${i + 1}`, text: value.trim() });
  }
  if (docs.length === 0) throw new InputError('EMPTY_FIELD', `${name} has no line`);
  return docs;
}

async function readParquet(file: string, name: string, field: string): Promise<Document[]> {
  let rows: Array<Record<string, unknown>>;
  try {
    const buffer = await asyncBufferFromFile(file);
    const metadata = await parquetMetadataAsync(buffer);
    const columns = parquetSchema(metadata).children.map((c) => c.element.name);
    if (!columns.includes(field)) throw new InputError('NO_COLUMN', `${name} has no column "${field}" (its columns: ${columns.join(', ')})`);
    rows = await parquetReadObjects({ file: buffer, metadata, columns: [field] });
  } catch (e) {
    if (e instanceof InputError) throw e;
    throw new InputError('UNREADABLE', `${name} is not a Parquet file hyparquet reads: ${(e as Error).message}`);
  }
  const docs: Document[] = [];
  for (const [i, row] of rows.entries()) {
    const value = row[field];
    if (typeof value !== 'string' || !value.trim()) throw new InputError('EMPTY_FIELD', `${name} row ${i + 1} has no text in its column "${field}"`);
    docs.push({ source: `${name}#${i + 1}`, text: value.trim() });
  }
  if (docs.length === 0) throw new InputError('EMPTY_FIELD', `${name} has no row`);
  return docs;
}
