import type { LiveSeries } from '@train-at-home/protocol';
import { useEffect, useRef, useState } from 'react';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';

export type XAxis = 'time' | 'microbatches';

/** Weight of the newest train loss in its moving average (train losses are one microbatch each: noisy). */
const EMA_ALPHA = 0.1;

/**
 * The columns uPlot draws, on one x: train losses (each a microbatch) and
 * their moving average, held-out losses (after merged rounds) and the bigram
 * baseline. On the microbatch axis, a held-out point sits at the number of
 * train losses stored before it (ids are one sequence across series).
 */
export function chartData(train: LiveSeries, held: LiveSeries, bigram: number | undefined, axis: XAxis): uPlot.AlignedData {
  type Row = [x: number, id: number, train: number | null, held: number | null];
  const rows: Row[] = [];
  const t = train.points;
  const h = held.points;
  let i = 0;
  let j = 0;
  // Merge both series by id (their common order); count train points for the microbatch axis.
  while (i < t.length || j < h.length) {
    const takeTrain = j >= h.length || (i < t.length && t[i]!.id < h[j]!.id);
    const p = takeTrain ? t[i++]! : h[j++]!;
    const x = axis === 'time' ? Date.parse(p.at) / 1000 : i;
    rows.push([x, p.id, takeTrain ? p.value : null, takeTrain ? null : p.value]);
  }
  // uPlot wants x ascending: ids are, and times of one process are (a restart keeps its clock).
  rows.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const xs = rows.map((r) => r[0]);
  const trainY = rows.map((r) => r[2]);
  // Debiased, as TensorBoard smooths: the first points are not pulled toward zero or the first value.
  let ema = 0;
  let n = 0;
  const emaY = trainY.map((v) => {
    if (v === null) return null;
    ema = (1 - EMA_ALPHA) * ema + EMA_ALPHA * v;
    n++;
    return ema / (1 - (1 - EMA_ALPHA) ** n);
  });
  const heldY = rows.map((r) => r[3]);
  const bigramY = xs.map(() => bigram ?? null);
  return [xs, trainY, emaY, heldY, bigramY];
}

/**
 * Loss over time or microbatches, live. Drag across the chart to zoom in,
 * the mouse wheel zooms around the pointer, shift-drag (or drag with two
 * fingers' scroll) pans, a double click returns to the whole run; while
 * zoomed, new points do not move the view.
 */
export function LossChart({ train, held, bigram, version }: { train: LiveSeries; held: LiveSeries; bigram?: number; version: number }) {
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
        axes: [{ label: axis === 'time' ? undefined : 'microbatches', space: window.innerWidth < 600 ? 90 : 50 }, { label: 'loss (nats/token)', size: 60 }],
        cursor: { drag: { x: true, y: false, setScale: true } },
        legend: { live: true },
        series: [
          {},
          { label: 'train (per microbatch)', stroke: 'rgba(47,111,237,0.25)', width: 1, points: { show: false }, spanGaps: true },
          { label: 'train (average)', stroke: '#2f6fed', width: 2, points: { show: false }, spanGaps: true },
          { label: 'held-out', stroke: '#d0461b', width: 2, points: { show: true, size: 6 }, spanGaps: true },
          { label: 'bigram baseline', stroke: '#1f7a45', width: 1, dash: [6, 4], points: { show: false }, spanGaps: true },
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
      chartData(train, held, bigram, axis),
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

  useEffect(() => {
    plot.current?.setData(chartData(train, held, bigram, axis), !zoomed.current);
  }, [version, bigram, axis, train, held]);

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
      <div ref={box} data-testid="loss-chart" data-points={train.points.length + held.points.length} data-train-points={train.points.length} data-heldout-points={held.points.length} />
    </div>
  );
}
