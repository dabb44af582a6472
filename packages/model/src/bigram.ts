/**
 * The bigram baseline: P(next | previous) from counts on the training split,
 * smoothed toward the unigram distribution with a pseudo-count k. Held-out
 * cross-entropy (nats per token) at the best k is the bar a model must beat
 * to show it learned more than adjacent-token statistics.
 */
export function bigramBaseline(train: Uint16Array, heldOut: Uint16Array, vocabSize: number): { loss: number; pseudoCount: number } {
  const pair = new Uint32Array(vocabSize * vocabSize);
  const first = new Float64Array(vocabSize);
  const unigram = new Float64Array(vocabSize).fill(1); // add-one for unseen tokens
  for (let i = 0; i + 1 < train.length; i++) {
    pair[train[i]! * vocabSize + train[i + 1]!]!++;
    first[train[i]!]!++;
    unigram[train[i + 1]!]!++;
  }
  const uniTotal = unigram.reduce((a, b) => a + b, 0);
  let best = { loss: Infinity, pseudoCount: 0 };
  for (const k of [0.1, 0.3, 1, 3, 10, 30, 100]) {
    let nll = 0;
    for (let i = 0; i + 1 < heldOut.length; i++) {
      const a = heldOut[i]!;
      const b = heldOut[i + 1]!;
      const p = (pair[a * vocabSize + b]! + (k * unigram[b]!) / uniTotal) / (first[a]! + k);
      nll -= Math.log(p);
    }
    const loss = nll / (heldOut.length - 1);
    if (loss < best.loss) best = { loss, pseudoCount: k };
  }
  return best;
}
