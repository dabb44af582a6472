/**
 * Proofs of an epoch's payouts, in OpenZeppelin's StandardMerkleTree format
 * (@openzeppelin/merkle-tree, 'standard-v1'), so a claim contract can use
 * OpenZeppelin's MerkleProof.verify as is, and anyone can check a payout
 * with a library they already trust rather than one we invented.
 *
 * Each payout is one leaf, the values [account, amount] with the encoding
 * ['string', 'uint256'] (amount in base units, as a decimal string):
 *
 *   leaf = keccak256(keccak256(abi.encode(account, amount)))
 *
 * (hashed twice so a leaf can never be mistaken for a 64-byte inner node).
 * An inner node is keccak256 of its two children concatenated smaller first
 * (sorted pairs, compared as 256-bit numbers), so a proof is just the list of
 * siblings from the leaf up, with no left/right flags.
 *
 * To check a proof with the library:
 *   import { StandardMerkleTree } from '@openzeppelin/merkle-tree';
 *   StandardMerkleTree.verify(root, ['string', 'uint256'], [account, amount], proof);
 * By hand (any keccak256 and ABI encoder, e.g. ethers or viem):
 *   h = keccak256(keccak256(abi.encode(['string','uint256'], [account, amount])))
 *   for each sibling x of proof: h = keccak256(min(h, x) ‖ max(h, x))
 *   the payout is in the tree iff h === root.
 * In Solidity: MerkleProof.verify(proof, root,
 *   keccak256(bytes.concat(keccak256(abi.encode(account, amount))))).
 */

import { StandardMerkleTree } from '@openzeppelin/merkle-tree';
import { IncentivesError } from './errors';

export const PAYOUT_LEAF_ENCODING: ['string', 'uint256'] = ['string', 'uint256'];

const UINT256_MAX = (1n << 256n) - 1n;
const HASH_PATTERN = /^0x[0-9a-fA-F]{64}$/;
const DECIMAL_PATTERN = /^(0|[1-9][0-9]*)$/;

export interface PayoutTree {
  /** 0x-prefixed keccak256 root, lower-case hex. */
  root: string;
  /** Proof of each account's leaf: the sibling hashes from the leaf up. */
  proofs: Record<string, string[]>;
}

export function payoutTree(payouts: Array<{ account: string; amount: bigint }>): PayoutTree {
  if (!Array.isArray(payouts) || payouts.length === 0) {
    throw new IncentivesError('EMPTY', 'a payout tree needs at least one payout');
  }
  // Validate everything first: the library would throw its own, less clear errors.
  const seen = new Set<string>();
  const leaves = payouts.map(({ account, amount }, i): [string, string] => {
    if (typeof account !== 'string' || account.length === 0) {
      throw new IncentivesError('BAD_ACCOUNT', `payout ${i} has no account`);
    }
    if (seen.has(account)) {
      // Two leaves for one account would let it claim twice.
      throw new IncentivesError('DUPLICATE_ACCOUNT', `account ${account} appears twice`);
    }
    seen.add(account);
    if (typeof amount !== 'bigint' || amount < 0n || amount > UINT256_MAX) {
      throw new IncentivesError('BAD_AMOUNT', `payout ${i} amount must be a bigint in [0, 2²⁵⁶), got ${String(amount)}`);
    }
    return [account, amount.toString()];
  });
  const tree = StandardMerkleTree.of(leaves, PAYOUT_LEAF_ENCODING);
  // fromEntries defines own properties, so an account named "__proto__" is safe.
  const proofs = Object.fromEntries([...tree.entries()].map(([i, [account]]) => [account, tree.getProof(i)]));
  return { root: tree.root, proofs };
}

/**
 * True iff `proof` proves the leaf [account, amount] under `root`. Anything
 * malformed (a root or sibling that is not 32 bytes of hex, a negative or
 * non-decimal amount, a non-string account) is simply not a valid proof:
 * false, never an exception, since the input comes from anyone.
 */
export function verifyPayout(root: string, account: string, amount: bigint | string, proof: string[]): boolean {
  try {
    if (typeof root !== 'string' || !HASH_PATTERN.test(root)) return false;
    if (typeof account !== 'string') return false;
    if (!Array.isArray(proof) || !proof.every((x) => typeof x === 'string' && HASH_PATTERN.test(x))) return false;
    let value: bigint;
    if (typeof amount === 'bigint') value = amount;
    else if (typeof amount === 'string' && DECIMAL_PATTERN.test(amount)) value = BigInt(amount);
    else return false;
    if (value < 0n || value > UINT256_MAX) return false;
    // The library compares hex strings as written: it returns lower case.
    return StandardMerkleTree.verify(
      root.toLowerCase(),
      PAYOUT_LEAF_ENCODING,
      [account, value.toString()],
      proof.map((x) => x.toLowerCase()),
    );
  } catch {
    return false;
  }
}
