import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parquetWriteBuffer } from 'hyparquet-writer';
import { corpusDocuments } from '@train-at-home/testkit/corpus';
import { afterAll, describe, expect, it } from 'vitest';
import { huggingFaceTokenizer } from '../export/hf-tokenizer';
import { Tokenizer, type TokenizerJSON } from '../tokenizer/bpe';
import { InputError } from './inputs';
import { prepareCorpus } from './prepare';
import { loadDataset } from './shards';

/**
 * `prepare-data --input`: an operator's own corpus in each format the command reads, written here (the Parquet one
 * with hyparquet-writer), prepared as the shipped one is; and every bad input refused by name with nothing written.
 */
const root = mkdtempSync(join(tmpdir(), 'tah-corpus-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const docs = corpusDocuments(30, 200);

/** The same 30 documents as text files, JSON lines and a Parquet file. */
function corpus(dir: string): { txt: string; jsonl: string; parquet: string } {
  mkdirSync(join(dir, 'txt'), { recursive: true });
  docs.forEach((d, i) => writeFileSync(join(dir, 'txt', `doc-${String(i).padStart(2, '0')}.txt`), d));
  writeFileSync(join(dir, 'all.jsonl'), docs.map((d, i) => JSON.stringify({ id: i, body: d })).join('\n') + '\n');
  writeFileSync(join(dir, 'all.parquet'), new Uint8Array(parquetWriteBuffer({ columnData: [{ name: 'id', data: docs.map((_, i) => i), type: 'INT32' }, { name: 'body', data: docs, type: 'STRING' }] })));
  return { txt: join(dir, 'txt'), jsonl: join(dir, 'all.jsonl'), parquet: join(dir, 'all.parquet') };
}
const inputs = corpus(join(root, 'in'));
const hashes = (dir: string): string[] => {
  const m = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8'));
  return [m.inputsHash, m.tokenizer.sha256, ...m.train.map((s: { sha256: string }) => s.sha256), ...m.heldOut.map((s: { sha256: string }) => s.sha256)];
};

describe('prepare-data --input', () => {
  it('prepares a folder of .txt, a .jsonl and a .parquet file the same way: deterministic shards, a held-out split disjoint from training, its tokens the held-out text', async () => {
    const lines: string[] = [];
    const first = await prepareCorpus({ inputs: [inputs.txt], name: 'mine', vocabSize: 300, outDir: join(root, 'a'), log: (l) => lines.push(l) });
    expect(first.built).toBe(true);
    expect(first.dir).toBe(join(root, 'a', 'mine-v1-bpe300'));
    expect(lines).toContain('data: read 100% (30 of 30)');
    // The same inputs elsewhere: the same bytes; again in place: nothing to do.
    const again = await prepareCorpus({ inputs: [inputs.txt], name: 'mine', vocabSize: 300, outDir: join(root, 'b') });
    expect(hashes(again.dir)).toEqual(hashes(first.dir));
    expect((await prepareCorpus({ inputs: [inputs.txt], name: 'mine', vocabSize: 300, outDir: join(root, 'a') })).built).toBe(false);
    // Held out: the last documents (a tenth of the bytes), none of them trained on.
    const m = first.manifest;
    expect(m.trainDocuments + m.heldOutDocuments.length).toBe(30);
    expect(m.heldOutDocuments.map((s) => s.split('/').pop())).toEqual(['doc-27.txt', 'doc-28.txt', 'doc-29.txt']);
    const data = loadDataset(first.dir);
    const tokenizer = new Tokenizer(JSON.parse(readFileSync(join(first.dir, 'tokenizer.json'), 'utf8')) as TokenizerJSON);
    const held = [...data.heldOut];
    const eot = tokenizer.eotId;
    const heldTexts: string[] = [];
    for (let at = 0; at < held.length; ) {
      const end = held.indexOf(eot, at);
      heldTexts.push(tokenizer.decode(held.slice(at, end)));
      at = end + 1;
    }
    expect(heldTexts).toEqual(docs.slice(27));
    // The JSON lines' field and the Parquet column: the same documents, so the same tokens.
    for (const [input, name] of [[inputs.jsonl, 'lines'], [inputs.parquet, 'table']] as const) {
      const r = await prepareCorpus({ inputs: [input], name, field: 'body', vocabSize: 300, outDir: join(root, name) });
      expect(r.manifest.trainTokens).toBe(m.trainTokens);
      expect(r.manifest.heldOutTokens).toBe(m.heldOutTokens);
      expect(r.manifest.tokenizer.sha256).toBe(m.tokenizer.sha256);
      expect(r.manifest.train.map((s) => s.sha256)).toEqual(m.train.map((s) => s.sha256));
    }
    // A glob, and a tokenizer given rather than trained.
    const globbed = await prepareCorpus({ inputs: [join(inputs.txt, 'doc-*.txt')], name: 'globbed', tokenizer: join(first.dir, 'tokenizer.json'), outDir: join(root, 'g') });
    expect(globbed.dir).toBe(join(root, 'g', 'globbed-v1-bpe300'));
    expect(globbed.manifest.tokenizer.sha256).toBe(m.tokenizer.sha256);
    expect(globbed.manifest.train.map((s) => s.sha256)).toEqual(m.train.map((s) => s.sha256));
    // A Hugging Face tokenizer.json of a byte-level BPE (here the one an export writes of this run's): the same
    // tokenizer, so the same shards; cut to a smaller vocabulary, its first merges.
    const hfFile = join(root, 'hf-tokenizer.json');
    writeFileSync(hfFile, JSON.stringify(huggingFaceTokenizer(tokenizer.json)));
    const fromHf = await prepareCorpus({ inputs: [inputs.txt], name: 'hf', tokenizer: hfFile, outDir: join(root, 'h') });
    expect(fromHf.manifest.tokenizer.sha256).toBe(m.tokenizer.sha256);
    expect(fromHf.manifest.train.map((s) => s.sha256)).toEqual(m.train.map((s) => s.sha256));
    const cut = await prepareCorpus({ inputs: [inputs.txt], name: 'hf', tokenizer: hfFile, vocabSize: 280, outDir: join(root, 'h') });
    expect(cut.dir).toBe(join(root, 'h', 'hf-v1-bpe280'));
    const cutJson = JSON.parse(readFileSync(join(cut.dir, 'tokenizer.json'), 'utf8')) as TokenizerJSON;
    expect(cutJson.merges).toEqual(tokenizer.json.merges.slice(0, 280 - 257));
  });

  it('refuses each bad input by name and writes nothing', async () => {
    const bad = join(root, 'bad');
    mkdirSync(bad, { recursive: true });
    writeFileSync(join(bad, 'no-field.jsonl'), `${JSON.stringify({ body: docs[0] })}\n${JSON.stringify({ title: 'x' })}\n`);
    writeFileSync(join(bad, 'empty-field.jsonl'), `${JSON.stringify({ body: '   ' })}\n`);
    writeFileSync(join(bad, 'not-json.jsonl'), `${JSON.stringify({ body: docs[0] })}\n{"body": \n`);
    writeFileSync(join(bad, 'empty.txt'), '\n\n');
    writeFileSync(join(bad, 'table.csv'), 'body\nhello\n');
    writeFileSync(join(bad, 'broken.parquet'), 'PAR1 not really');
    writeFileSync(join(bad, 'other.parquet'), new Uint8Array(parquetWriteBuffer({ columnData: [{ name: 'title', data: ['a', 'b'], type: 'STRING' }] })));
    writeFileSync(join(bad, 'blank.parquet'), new Uint8Array(parquetWriteBuffer({ columnData: [{ name: 'body', data: [docs[0]!, ''], type: 'STRING' }] })));
    writeFileSync(join(bad, 'tokenizer.json'), JSON.stringify({ format: 'something-else' }));
    writeFileSync(join(bad, 'wordpiece.json'), JSON.stringify({ model: { type: 'WordPiece', vocab: {} }, pre_tokenizer: { type: 'BertPreTokenizer' } }));
    writeFileSync(join(bad, 'unbuilt.json'), JSON.stringify({ model: { type: 'BPE', merges: ['ab c'] }, pre_tokenizer: { type: 'ByteLevel' } }));
    writeFileSync(join(bad, 'one.txt'), docs[0]!);
    const cases: Array<[string, Parameters<typeof prepareCorpus>[0]['inputs'], Partial<Parameters<typeof prepareCorpus>[0]>]> = [
      ['UNREADABLE', [join(bad, 'missing.txt')], {}],
      ['NO_INPUT', [join(bad, 'nothing-*.txt')], {}],
      ['EMPTY_FIELD', [join(bad, 'no-field.jsonl')], { field: 'body' }],
      ['EMPTY_FIELD', [join(bad, 'empty-field.jsonl')], { field: 'body' }],
      ['BAD_LINE', [join(bad, 'not-json.jsonl')], { field: 'body' }],
      ['EMPTY_FIELD', [join(bad, 'empty.txt')], {}],
      ['UNSUPPORTED', [join(bad, 'table.csv')], {}],
      ['UNREADABLE', [join(bad, 'broken.parquet')], { field: 'body' }],
      ['NO_COLUMN', [join(bad, 'other.parquet')], { field: 'body' }],
      ['EMPTY_FIELD', [join(bad, 'blank.parquet')], { field: 'body' }],
      ['BAD_TOKENIZER', [inputs.txt], { tokenizer: join(bad, 'tokenizer.json') }],
      ['BAD_TOKENIZER', [inputs.txt], { tokenizer: join(bad, 'wordpiece.json') }],
      ['BAD_TOKENIZER', [inputs.txt], { tokenizer: join(bad, 'unbuilt.json') }],
      ['TOO_SMALL', [join(bad, 'one.txt')], {}],
      ['TOO_SMALL', [inputs.txt], { heldOutBytes: 1e9 }],
      ['BAD_NAME', [inputs.txt], { name: '../up' }],
    ];
    for (const [code, input, extra] of cases) {
      const out = join(root, `refused-${code}-${Math.random().toString(36).slice(2)}`);
      const error = await prepareCorpus({ inputs: input, name: 'bad', vocabSize: 300, outDir: out, ...extra }).catch((e: unknown) => e);
      expect(error, `${code} for ${input.join(' ')}`).toBeInstanceOf(InputError);
      expect((error as InputError).code, (error as Error).message).toBe(code);
      expect(existsSync(out) ? readdirSync(out) : []).toEqual([]);
    }
  });
});
