/** A request over the app's per-IP limit (app.ts): answered 429 RATE_LIMITED with the time to wait. */
export class RateLimited extends Error {
  override name = 'RateLimited';
  readonly statusCode = 429;
  constructor(readonly retryAfterMs: number) {
    super(`too many requests from this IP address; retry in ${Math.ceil(retryAfterMs / 1000)} s`);
  }

  get body(): { error: 'RATE_LIMITED'; message: string; retryAfterMs: number } {
    return { error: 'RATE_LIMITED', message: this.message, retryAfterMs: this.retryAfterMs };
  }
}
