/**
 * Prepares the training data (held-out split, BPE tokenizer, token shards)
 * under ./data. Cached: a second run with the same corpora does nothing.
 *   npm run prepare-data [-- --vocab 4096]                    the shipped corpora (State of the Union, Brown)
 *   npm run prepare-data -- --input PATH… --name NAME [--field text] [--vocab 4096] [--tokenizer tokenizer.json]
 *                           [--held-out-bytes N] [--out DIR]   an operator's own: .txt, .jsonl, .parquet files,
 *                                                              folders or globs; serve it with `--data DIR/NAME-v1-bpe<V>`
 */
import { parseArgs } from 'node:util';
import { DATA_DIR, InputError, prepareCorpus, prepareData } from '@train-at-home/model/node';

const { values } = parseArgs({
  options: {
    vocab: { type: 'string', multiple: true },
    input: { type: 'string', multiple: true },
    name: { type: 'string' },
    field: { type: 'string' },
    tokenizer: { type: 'string' },
    'held-out-bytes': { type: 'string' },
    out: { type: 'string' },
  },
});
if (!values.input) {
  const vocabs = (values.vocab ?? ['4096', '320']).map(Number);
  for (const vocabSize of vocabs) prepareData({ outDir: values.out ?? DATA_DIR, vocabSize, log: console.log });
} else {
  try {
    // With --tokenizer, --vocab (if given) cuts a Hugging Face tokenizer's merges to a preset's vocabulary.
    const vocabs = values.tokenizer && !values.vocab ? [undefined] : (values.vocab ?? ['4096']).map(Number);
    for (const vocabSize of vocabs) {
      const { dir } = await prepareCorpus({
        inputs: values.input,
        name: values.name ?? 'corpus',
        field: values.field,
        tokenizer: values.tokenizer,
        vocabSize,
        heldOutBytes: values['held-out-bytes'] ? Number(values['held-out-bytes']) : undefined,
        outDir: values.out ?? DATA_DIR,
        log: console.log,
      });
      console.log(`data: serve it with: npm run coordinator -- --data ${dir}`);
    }
  } catch (e) {
    if (!(e instanceof InputError)) throw e;
    console.error(`prepare-data: ${e.message} (nothing was written)`);
    process.exit(1);
  }
}
