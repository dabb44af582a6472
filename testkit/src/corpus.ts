/** An operator's corpus for tests: documents of plain words, the same for the same seeds, in each format prepare-data reads. */
const WORDS = 'the run trains one model together from many tabs and pays each person for the work they really did while peers swap activations'.split(' ');

/** `count` documents of `words` words each, the same every time. */
export function corpusDocuments(count: number, words: number): string[] {
  return Array.from({ length: count }, (_, d) => {
    let x = (d + 1) * 2654435761 + 1;
    const out: string[] = [];
    for (let i = 0; i < words; i++) {
      x = (x * 1103515245 + 12345) % 2 ** 31;
      out.push(WORDS[x % WORDS.length]!);
    }
    return `${out.join(' ')}.`;
  });
}
