import { encodeAddress, decodeAddress } from '@polkadot/util-crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { cryptoReady, generateIdentity } from './identity';
import { canonicalAddress, formatRewardsMessage, MAX_CLAIM_EPOCHS, parseRewardsMessage, RewardsMessageError, type ClaimMessage, type LinkMessage } from './rewards';

beforeAll(async () => {
  await cryptoReady();
});

const nonce = `0x${'ab'.repeat(32)}`;
const expires = '2030-01-02T03:04:05.678Z';

function code(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(RewardsMessageError);
    return (e as RewardsMessageError).code;
  }
  return 'accepted';
}

describe('rewards messages', () => {
  it('formats and parses link and claim messages, byte for byte', () => {
    const miner = generateIdentity();
    const link: LinkMessage = { kind: 'link', domain: 'train.example.org:8080', minerId: miner.publicKey, address: generateIdentity().address, nonce, expires };
    const text = formatRewardsMessage(link);
    expect(text.split('\n')).toEqual([
      'Train at Home: link a payout address',
      'domain: train.example.org:8080',
      `miner: ${miner.publicKey}`,
      `address: ${link.address}`,
      `nonce: ${nonce}`,
      `expires: ${expires}`,
    ]);
    expect(parseRewardsMessage(text)).toEqual(link);
    const claim: ClaimMessage = { kind: 'claim', domain: 'localhost', address: link.address, amount: 2n ** 62n, epochs: [{ runId: 1, epoch: 0 }, { runId: 1, epoch: 7 }, { runId: 2, epoch: 0 }], nonce, expires };
    const claimText = formatRewardsMessage(claim);
    expect(claimText).toContain('\nepochs: 1:0,1:7,2:0\n');
    expect(parseRewardsMessage(claimText)).toEqual(claim);
  });

  it('gives every wallet one spelling: the generic SS58 format', () => {
    const { address } = generateIdentity();
    const polkadot = encodeAddress(decodeAddress(address), 0);
    expect(polkadot).not.toBe(address);
    expect(canonicalAddress(polkadot)).toBe(address);
    const claim = formatRewardsMessage({ kind: 'claim', domain: 'localhost', address: polkadot, amount: 1n, epochs: [{ runId: 1, epoch: 0 }], nonce, expires });
    expect(code(() => parseRewardsMessage(claim))).toBe('BAD_MESSAGE');
    for (const bad of ['', 'hello', `0x${'11'.repeat(32)}`, `${address.slice(0, -1)}${address.endsWith('a') ? 'b' : 'a'}`, address.slice(0, 40), 42]) {
      expect(code(() => canonicalAddress(bad))).toBe('BAD_ADDRESS');
    }
  });

  it('refuses anything the writer would not write', () => {
    const address = generateIdentity().address;
    const good = formatRewardsMessage({ kind: 'claim', domain: 'localhost', address, amount: 5n, epochs: [{ runId: 1, epoch: 2 }], nonce, expires });
    const variants = [
      good.replace('Train at Home', 'Train at home'),
      `${good}\n`,
      good.replace('\n', '\r\n'),
      good.replace('amount: 5', 'amount: 05'),
      good.replace('amount: 5', 'amount: 0'),
      good.replace('amount: 5', 'amount: -5'),
      good.replace('amount: 5', `amount: ${2n ** 63n}`),
      good.replace('epochs: 1:2', 'epochs: 1:2,1:2'),
      good.replace('epochs: 1:2', 'epochs: 1:3,1:2'),
      good.replace('epochs: 1:2', 'epochs: 0:2'),
      good.replace('epochs: 1:2', 'epochs: 1:2147483648'),
      good.replace('epochs: 1:2', 'epochs: '),
      good.replace('epochs: 1:2', `epochs: ${Array.from({ length: MAX_CLAIM_EPOCHS + 1 }, (_, i) => `1:${i}`).join(',')}`),
      good.replace('domain: localhost', 'domain: LOCALHOST'),
      good.replace('domain: localhost', 'domain: local host'),
      good.replace(nonce, nonce.toUpperCase().replace('0X', '0x')),
      good.replace(expires, '2030-01-02T03:04:05Z'),
      good.replace(expires, '2030-02-30T03:04:05.678Z'),
      good.replace('nonce: ', 'nonce:'),
      'x'.repeat(9000),
    ];
    for (const v of variants) expect(code(() => parseRewardsMessage(v)), v.slice(0, 200)).toBe('BAD_MESSAGE');
    expect(code(() => parseRewardsMessage(good.replace(address, 'not-an-address')))).toBe('BAD_ADDRESS');
    expect(code(() => parseRewardsMessage(42))).toBe('BAD_MESSAGE');
  });
});
