import { StandardMerkleTree } from '@openzeppelin/merkle-tree';
import { describe, expect, it } from 'vitest';
import { splitEmission } from './emission';
import { PAYOUT_LEAF_ENCODING, payoutTree, verifyPayout } from './merkle';
import { errorCode } from '@train-at-home/testkit/incentives-errors';

const PAYOUTS = splitEmission(10n ** 24n, [
  { account: '5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY', score: 120 },
  { account: '5FHneW46xGXgs5mUiveU4sbTyGBzmstUspZC92UhjJM694ty', score: 80.5 },
  { account: '5FLSigC9HGRKVhB9FiEo4Y3koPsNmBmLJbpXg2mp1hXcS59Y', score: 3 },
  { account: '__proto__', score: 1 },
  { account: 'carol', score: 0.25 },
]).payouts;

function flipLastHexDigit(hash: string): string {
  return hash.slice(0, -1) + (hash.endsWith('0') ? '1' : '0');
}

describe('payout Merkle tree', () => {
  const { root, proofs } = payoutTree(PAYOUTS);

  it('proves every payout, with our verifier and with OpenZeppelin’s', () => {
    expect(root).toMatch(/^0x[0-9a-f]{64}$/);
    expect(Object.keys(proofs).sort()).toEqual(PAYOUTS.map((p) => p.account).sort());
    for (const { account, amount } of PAYOUTS) {
      const proof = proofs[account]!;
      expect(verifyPayout(root, account, amount, proof)).toBe(true);
      expect(verifyPayout(root, account, amount.toString(), proof)).toBe(true);
      expect(verifyPayout(root.toUpperCase().replace('0X', '0x'), account, amount, proof)).toBe(true);
      expect(StandardMerkleTree.verify(root, PAYOUT_LEAF_ENCODING, [account, amount.toString()], proof)).toBe(true);
    }
  });

  it('rejects a tampered proof, amount, account or root', () => {
    const [first, second] = PAYOUTS;
    const proof = proofs[first!.account]!;
    expect(verifyPayout(root, first!.account, first!.amount + 1n, proof)).toBe(false);
    expect(verifyPayout(root, second!.account, first!.amount, proof)).toBe(false);
    expect(verifyPayout(root, first!.account, first!.amount, proofs[second!.account]!)).toBe(false);
    expect(verifyPayout(root, first!.account, first!.amount, [flipLastHexDigit(proof[0]!), ...proof.slice(1)])).toBe(false);
    expect(verifyPayout(root, first!.account, first!.amount, proof.slice(1))).toBe(false);
    expect(verifyPayout(flipLastHexDigit(root), first!.account, first!.amount, proof)).toBe(false);
  });

  it('returns false, never throws, on malformed input', () => {
    const { account, amount } = PAYOUTS[0]!;
    const proof = proofs[account]!;
    const bad = (...args: unknown[]) =>
      verifyPayout(...(args as [string, string, bigint | string, string[]]));
    expect(bad('not hex', account, amount, proof)).toBe(false);
    expect(bad(root.slice(0, 40), account, amount, proof)).toBe(false);
    expect(bad(root, account, -1n, proof)).toBe(false);
    expect(bad(root, account, '-1', proof)).toBe(false);
    expect(bad(root, account, '1.5', proof)).toBe(false);
    expect(bad(root, account, '0x10', proof)).toBe(false);
    expect(bad(root, account, 2n ** 256n, proof)).toBe(false);
    expect(bad(root, account, 12, proof)).toBe(false);
    expect(bad(root, account, amount, ['0x1234'])).toBe(false);
    expect(bad(root, account, amount, 'not a list')).toBe(false);
    expect(bad(root, account, amount, [null])).toBe(false);
    expect(bad(root, 42, amount, proof)).toBe(false);
    expect(bad(undefined, undefined, undefined, undefined)).toBe(false);
  });

  it('a single payout is its own root, with an empty proof', () => {
    const single = payoutTree([{ account: 'solo', amount: 5n }]);
    expect(single.proofs['solo']).toEqual([]);
    expect(verifyPayout(single.root, 'solo', 5n, [])).toBe(true);
    expect(verifyPayout(single.root, 'solo', 6n, [])).toBe(false);
  });

  it('refuses an empty list, duplicate accounts and amounts outside uint256', () => {
    const code = errorCode;
    expect(code(() => payoutTree([]))).toBe('EMPTY');
    expect(
      code(() =>
        payoutTree([
          { account: 'a', amount: 1n },
          { account: 'a', amount: 2n },
        ]),
      ),
    ).toBe('DUPLICATE_ACCOUNT');
    expect(code(() => payoutTree([{ account: 'a', amount: -1n }]))).toBe('BAD_AMOUNT');
    expect(code(() => payoutTree([{ account: 'a', amount: 2n ** 256n }]))).toBe('BAD_AMOUNT');
    expect(code(() => payoutTree([{ account: '', amount: 1n }]))).toBe('BAD_ACCOUNT');
  });

  it('does not depend on the order of the payouts', () => {
    expect(payoutTree([...PAYOUTS].reverse()).root).toBe(root);
  });
});
