/**
 * The coordinator's clock for ordering a miner's reports: microseconds, strictly
 * increasing within this process, as ISO text (JavaScript Dates hold
 * milliseconds only, and node-postgres reads timestamps back as Dates: compare
 * these inside SQL). Taken when a socket event arrives, so a report that
 * waits (for its microbatch's announcement) keeps its place in the miner's order.
 *
 * The wall clock (Date.now), the one every window an arrival is counted in is cut
 * by, with a microsecond added per arrival within the same millisecond: an arrival
 * is never stamped later than the wall clock read after it. (Read off the monotonic
 * clock instead, performance.timeOrigin + performance.now(), arrivals ran up to a
 * millisecond and more ahead of Date.now(): a transfer confirmed just before a
 * window ending at Date.now() + 1 fell outside it.)
 */
let last = 0;

export function arrivalTime(): string {
  let us = Date.now() * 1000;
  if (us <= last) us = last + 1;
  last = us;
  const iso = new Date(Math.floor(us / 1000)).toISOString(); // …ss.mmmZ
  return `${iso.slice(0, -1)}${String(us % 1000).padStart(3, '0')}Z`;
}
