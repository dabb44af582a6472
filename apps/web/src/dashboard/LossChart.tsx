import type { LiveSeries } from '@train-at-home/protocol';
import { useEffect, useRef, useState } from 'react';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';

export type XAxis = 'time' | 'microbatches';

/** Weight of the newest train loss in its moving average (train losses are one microbatch each: noisy). */
const EMA_ALPHA = 0.1;

/** A silence this many times the run's usual spacing of losses (and at least OUTAGE_MIN_MS) is an outage. */
const OUTAGE_FACTOR = 5;
const OUTAGE_MIN_MS = 15_000;

/**
 * The columns uPlot draws, on one x: train losses (each a microbatch) and
 * their moving average, held-out losses (after merged rounds) and the bigram
 * baseline. On the microbatch axis, a held-out point sits at the number of
 * train losses stored before it (ids are one sequence across series).
 *
 * uPlot joins over `undefined` (a series with no point at that x) and breaks
 * its line at `null`: where no loss arrived for far longer than usual (the
 * coordinator or the whole swarm was down), a row of nulls is put in, so an
 * outage shows as a gap in every line instead of a straight segment across it.
 */
export function chartData(train: LiveSeries, held: LiveSeries, bigram: number | undefined, axis: XAxis, outages: Array<{ from: number; to: number }> = []): uPlot.AlignedData & { gaps?: number } {
  type Row = [x: number, id: number, train: number | null | undefined, held: number | null | undefined, at: number];
  const rows: Row[] = [];
  const t = train.points;
  const h = held.points;
  let i = 0;
  let j = 0;
  // Merge both series by id (their common order); count train points for the microbatch axis.
  while (i < t.length || j < h.length) {
    const takeTrain = j >= h.length || (i < t.length && t[i]!.id < h[j]!.id);
    const p = takeTrain ? t[i++]! : h[j++]!;
    const at = Date.parse(p.at);
    const x = axis === 'time' ? at / 1000 : i;
    rows.push([x, p.id, takeTrain ? p.value : undefined, takeTrain ? undefined : p.value, at]);
  }
  // uPlot wants x ascending: ids are, and times of one process are (a restart keeps its clock).
  rows.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  // Outages: the usual spacing is the median time between consecutive losses.
  const spacing = rows
    .slice(1)
    .map((r, k) => r[4] - rows[k]![4])
    .sort((a, b) => a - b);
  const outage = Math.max(OUTAGE_MIN_MS, OUTAGE_FACTOR * (spacing[Math.floor(spacing.length / 2)] ?? 0));
  let gaps = 0;
  for (let k = rows.length - 1; k > 0; k--) {
    const [prev, next] = [rows[k - 1]!, rows[k]!];
    // A long silence, or one that spans a known coordinator restart (from its last heartbeat to its start again).
    if (next[4] - prev[4] <= outage && !outages.some((o) => prev[4] <= o.to && next[4] >= o.from)) continue;
    rows.splice(k, 0, [(prev[0] + next[0]) / 2, prev[1], null, null, (prev[4] + next[4]) / 2]);
    gaps++;
  }
  const xs = rows.map((r) => r[0]);
  const trainY = rows.map((r) => r[2]);
  // Debiased, as TensorBoard smooths: the first points are not pulled toward zero or the first value.
  let ema = 0;
  let n = 0;
  const emaY = trainY.map((v) => {
    if (v === null || v === undefined) return v;
    ema = (1 - EMA_ALPHA) * ema + EMA_ALPHA * v;
    n++;
    return ema / (1 - (1 - EMA_ALPHA) ** n);
  });
  const heldY = rows.map((r) => r[3]);
  const bigramY = xs.map(() => bigram ?? null);
  return Object.assign([xs, trainY, emaY, heldY, bigramY] as uPlot.AlignedData, { gaps });
}

/**
 * A series' value in the legend: at the cursor, or the latest when the cursor is off the chart (uPlot shows "--"
 * there), and for a sparse series (held-out losses come after merges) its latest value at or before the cursor.
 */
function legendValue(self: uPlot, _v: number | null, sidx: number, idx: number | null): string {
  const ys = self.data[sidx] ?? [];
  for (let k = idx ?? ys.length - 1; k >= 0; k--) {
    const y = ys[k];
    if (typeof y === 'number') return y.toFixed(3);
    if (y === null) break; // an outage: nothing is known across it
  }
  return '—';
}

/**
 * Loss over time or microbatches, live. Drag across the chart to zoom in,
 * the mouse wheel zooms around the pointer, shift-drag (or drag with two
 * fingers' scroll) pans, a double click returns to the whole run; while
 * zoomed, new points do not move the view.
 */
export function LossChart({ train, held, bigram, version, outages = [] }: { train: LiveSeries; held: LiveSeries; bigram?: number; version: number; outages?: Array<{ from: number; to: number }> }) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | undefined>(undefined);
  const zoomed = useRef(false);
  const [axis, setAxis] = useState<XAxis>('time');

  useEffect(() => {
    const el = box.current!;
    const width = (): number => Math.max(280, el.clientWidth);
    const height = (): number => (window.innerWidth < 600 ? 240 : 320);
    const u = new uPlot(
      {
        width: width(),
        height: height(),
        scales: { x: { time: axis === 'time' } },
        // Room for a whole time label ("12:34:56 PM") between ticks, at every width.
        axes: [{ label: axis === 'time' ? undefined : 'microbatches', space: axis === 'time' ? 110 : 70 }, { label: 'loss (nats/token)', size: 60 }],
        cursor: { drag: { x: true, y: false, setScale: true } },
        legend: { live: true },
        series: [
          { value: (self, v, _s, idx) => (idx === null ? 'latest' : axis === 'time' ? new Date(v * 1000).toLocaleTimeString() : `${v} microbatches`) },
          { label: 'train (per microbatch)', stroke: 'rgba(47,111,237,0.25)', width: 1, points: { show: false }, spanGaps: false, value: legendValue },
          { label: 'train (average)', stroke: '#2f6fed', width: 2, points: { show: false }, spanGaps: false, value: legendValue },
          { label: 'held-out', stroke: '#d0461b', width: 2, points: { show: true, size: 6 }, spanGaps: false, value: legendValue },
          { label: 'bigram baseline', stroke: '#1f7a45', width: 1, dash: [6, 4], points: { show: false }, spanGaps: false, value: legendValue },
        ],
        hooks: {
          setSelect: [() => (zoomed.current = true)],
          ready: [
            (self) => {
              const over = self.over;
              over.addEventListener('dblclick', () => {
                zoomed.current = false;
                self.setData(self.data, true);
              });
              over.addEventListener(
                'wheel',
                (e) => {
                  e.preventDefault();
                  const { min, max } = self.scales.x;
                  if (min === undefined || max === undefined) return;
                  const at = self.posToVal(e.offsetX, 'x');
                  const factor = e.deltaY < 0 ? 0.8 : 1.25;
                  zoomed.current = true;
                  self.setScale('x', { min: at - (at - min) * factor, max: at + (max - at) * factor });
                },
                { passive: false },
              );
              let dragFrom: { x: number; min: number; max: number } | undefined;
              over.addEventListener('mousedown', (e) => {
                if (!e.shiftKey) return;
                const { min, max } = self.scales.x;
                if (min !== undefined && max !== undefined) dragFrom = { x: e.clientX, min, max };
                e.stopPropagation();
              }, true);
              window.addEventListener('mousemove', (e) => {
                if (!dragFrom) return;
                const perPx = (dragFrom.max - dragFrom.min) / over.clientWidth;
                const dx = (e.clientX - dragFrom.x) * perPx;
                zoomed.current = true;
                self.setScale('x', { min: dragFrom.min - dx, max: dragFrom.max - dx });
              });
              window.addEventListener('mouseup', () => (dragFrom = undefined));
            },
          ],
        },
      },
      chartData(train, held, bigram, axis, outages),
      el,
    );
    plot.current = u;
    zoomed.current = false;
    const resize = new ResizeObserver(() => u.setSize({ width: width(), height: height() }));
    resize.observe(el);
    return () => {
      resize.disconnect();
      u.destroy();
      plot.current = undefined;
    };
    // A new axis is a new chart; the data follows through `version`.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [axis]);

  const [gaps, setGaps] = useState(0);
  useEffect(() => {
    const data = chartData(train, held, bigram, axis, outages);
    plot.current?.setData(data, !zoomed.current);
    setGaps(data.gaps ?? 0);
  }, [version, bigram, axis, train, held, outages.length]);

  return (
    <div className="chart">
      <div className="chart-controls" role="group" aria-label="x axis">
        <span className="hint">x:</span>
        {(['time', 'microbatches'] as const).map((a) => (
          <button key={a} className={a === axis ? 'on' : ''} onClick={() => setAxis(a)} data-testid={`axis-${a}`}>
            {a}
          </button>
        ))}
        <span className="hint">drag to zoom, wheel to zoom, shift-drag to pan, double-click for the whole run</span>
      </div>
      <div ref={box} data-testid="loss-chart" data-points={train.points.length + held.points.length} data-train-points={train.points.length} data-heldout-points={held.points.length} data-gaps={gaps} />
    </div>
  );
}
