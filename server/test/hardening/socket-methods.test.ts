import { generateIdentity, PROTOCOL_VERSION } from '@train-at-home/protocol';
import { afterEach, describe, expect, it } from 'vitest';
import { emitWithAck, hardeningHarness } from '@train-at-home/testkit/hardening-harness';

/** Defect 6: a DELETE on a live socket.io session answered 500 from the transport itself. */
describe('other HTTP methods on socket.io', () => {
  const h = hardeningHarness();
  afterEach(() => h.close());

  it('a DELETE on a live session gets a clear 4xx, and the session lives on', async () => {
    const { url } = await h.start();
    const socket = await h.open(url, ['polling']);
    const sid = (socket.io.engine as unknown as { id: string }).id;
    const res = await fetch(`${url}/socket.io/?EIO=4&transport=polling&sid=${sid}`, { method: 'DELETE' });
    expect(res.status).toBe(405);
    expect(await res.json()).toMatchObject({ error: 'METHOD_NOT_ALLOWED' });
    expect(await emitWithAck(socket, 'hello', { v: PROTOCOL_VERSION, publicKey: generateIdentity().publicKey })).toMatchObject({ ok: true });
  });
});
