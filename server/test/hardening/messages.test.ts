import { generateIdentity, PROTOCOL_VERSION } from '@train-at-home/protocol';
import { afterEach, describe, expect, it } from 'vitest';
import { emitWithAck, hardeningHarness } from '@train-at-home/testkit/hardening-harness';

/** Defect 5: a version that is an object threw inside the version check; a message with no payload never got its acknowledgement. */
describe('odd socket messages', () => {
  const h = hardeningHarness();
  afterEach(() => h.close());

  it('a version that is an object, and a message with no payload, get a named rejection as their acknowledgement', async () => {
    const { url } = await h.start();
    const socket = await h.open(url);
    expect(await emitWithAck(socket, 'hello', { v: { toString: 1 }, publicKey: generateIdentity().publicKey })).toMatchObject({ ok: false, error: { code: 'SCHEMA' } });
    expect(await emitWithAck(socket, 'heartbeat')).toMatchObject({ ok: false, error: { code: 'SCHEMA' } });
    // The connection still works.
    expect(await emitWithAck(socket, 'hello', { v: PROTOCOL_VERSION, publicKey: generateIdentity().publicKey })).toMatchObject({ ok: true });
  });
});
