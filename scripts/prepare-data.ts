/**
 * Prepares the training data (held-out split, BPE tokenizer, token shards)
 * under ./data. Cached: a second run with the same corpora does nothing.
 *   npm run prepare-data [-- --vocab 4096]
 */
import { parseArgs } from 'node:util';
import { DATA_DIR, prepareData } from '@train-at-home/model/node';

const { values } = parseArgs({ options: { vocab: { type: 'string', multiple: true } } });
const vocabs = (values.vocab ?? ['4096', '320']).map(Number);
for (const vocabSize of vocabs) prepareData({ outDir: DATA_DIR, vocabSize, log: console.log });
