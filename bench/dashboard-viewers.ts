/**
 * Dashboard viewers for bench/dashboard.ts, in a process of their own (so
 * they do not share the coordinator's event loop): TAH_VIEWERS socket.io
 * connections to the /dashboard namespace, each recording the delay of every
 * update it gets (receipt time − the coordinator's sentAt; one machine, one
 * clock). Over IPC: { connected } once all are, then on request { report }.
 */
import { DASHBOARD_NAMESPACE, type DashboardUpdate } from '@train-at-home/protocol';
import { io, type Socket } from 'socket.io-client';

const { url, viewers } = JSON.parse(process.env.TAH_VIEWERS ?? '{}') as { url: string; viewers: number };
const sockets: Socket[] = [];
let delays: number[] = [];
let updates = 0;
const perViewer = new Map<Socket, number>();

for (let i = 0; i < viewers; i++) {
  const s = io(`${url}${DASHBOARD_NAMESPACE}`, { transports: ['websocket'], forceNew: true, reconnection: true });
  perViewer.set(s, 0);
  s.on('update', (u: DashboardUpdate) => {
    delays.push(Date.now() - u.sentAt);
    updates++;
    perViewer.set(s, perViewer.get(s)! + 1);
  });
  sockets.push(s);
  if (i % 50 === 49) await new Promise((r) => setTimeout(r, 100)); // connect in waves
}
const all = async (): Promise<void> => {
  while (sockets.some((s) => !s.connected)) await new Promise((r) => setTimeout(r, 200));
};
await all();
process.send!({ connected: sockets.length });

process.on('message', (m: { reset?: boolean; report?: boolean }) => {
  if (m.reset) {
    delays = [];
    updates = 0;
    for (const s of sockets) perViewer.set(s, 0);
    process.send!({ reset: true });
  }
  if (m.report) {
    const counts = [...perViewer.values()];
    process.send!({ report: { delays, updates, minPerViewer: Math.min(...counts), maxPerViewer: Math.max(...counts), connected: sockets.filter((s) => s.connected).length } });
  }
});
process.on('disconnect', () => process.exit(0));
