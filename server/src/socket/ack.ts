/** What a handler answers: through the sender's acknowledgement callback, or a `reply` event when it sent none. */
export type Ack = (reply: { ok: true; [k: string]: unknown } | { ok: false; error: { code: string; message: string; retryAfterMs?: number } }) => void;

/**
 * An event's arguments as socket.io hands them over: the payloads the sender
 * emitted, then, when it asked for an acknowledgement, the callback, always
 * last (no function crosses the wire, so a function is only ever that
 * callback). Read from the end, so an event with no payload, or with several,
 * still finds its callback: its rejection goes back through it, not as a
 * separate `reply` event its sender never waits for.
 */
export function eventArgs(args: unknown[]): { payloads: unknown[]; callback: Ack | undefined } {
  const last = args[args.length - 1];
  return typeof last === 'function' ? { payloads: args.slice(0, -1), callback: last as Ack } : { payloads: args, callback: undefined };
}
