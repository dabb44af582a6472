/**
 * The coordinator's clock for ordering a miner's reports: microseconds, strictly
 * increasing within this process, as ISO text (JavaScript Dates hold
 * milliseconds only, and node-postgres reads timestamps back as Dates: compare
 * these inside SQL). Taken when a socket event arrives, so a report that
 * waits (for its microbatch's announcement) keeps its place in the miner's order.
 */
let last = 0;

export function arrivalTime(): string {
  let us = Math.floor((performance.timeOrigin + performance.now()) * 1000);
  if (us <= last) us = last + 1;
  last = us;
  const iso = new Date(Math.floor(us / 1000)).toISOString(); // …ss.mmmZ
  return `${iso.slice(0, -1)}${String(us % 1000).padStart(3, '0')}Z`;
}
