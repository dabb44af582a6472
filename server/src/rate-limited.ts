/** A request over a rate limit (the app's per-IP one, app.ts; the rewards routes' own): answered 429 RATE_LIMITED with the time to wait. */
export class RateLimited extends Error {
  override name = 'RateLimited';
  readonly statusCode = 429;
  constructor(
    readonly retryAfterMs: number,
    who = 'from this IP address',
  ) {
    super(`too many requests ${who}; retry in ${Math.ceil(retryAfterMs / 1000)} s`);
  }

  get body(): { error: 'RATE_LIMITED'; message: string; retryAfterMs: number } {
    return { error: 'RATE_LIMITED', message: this.message, retryAfterMs: this.retryAfterMs };
  }
}
