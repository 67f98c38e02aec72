import { basename, join } from 'node:path';
import { readJsonlTolerant } from '../util/jsonl.js';

// A dependency-free SVG line chart of RL runs: one panel per metric, one colour per run, RL steps
// concatenated across stages. Small enough to read in a browser or convert to PNG with headless chromium.

interface Series {
  label: string;
  points: [number, number][];
}

// pairs of a dark and a light shade, so runs given as (arm A, arm B, arm A', arm B') read as two arms
// tab10: a seed sweep with its ablation arms is 10 runs, each its own colour
const COLORS = [
  '#1f77b4',
  '#ff7f0e',
  '#2ca02c',
  '#d62728',
  '#9467bd',
  '#8c564b',
  '#e377c2',
  '#7f7f7f',
  '#bcbd22',
  '#17becf',
];
const LEGEND_W = 180; // px per legend entry; entries wrap into rows

function smooth(points: [number, number][], w: number): [number, number][] {
  return points.map(([x], i) => {
    const win = points.slice(Math.max(0, i - w + 1), i + 1);
    return [x, win.reduce((a, p) => a + p[1], 0) / win.length];
  });
}

function panel(title: string, series: Series[], x0: number, y0: number, w: number, h: number): string {
  const xs = series.flatMap((s) => s.points.map((p) => p[0]));
  const ys = series.flatMap((s) => s.points.map((p) => p[1]));
  const xMax = Math.max(1, ...xs);
  const yMax = Math.max(0.05, ...ys) * 1.05;
  const sx = (x: number) => x0 + 40 + (x / xMax) * (w - 50);
  const sy = (y: number) => y0 + h - 25 - (y / yMax) * (h - 50);
  let out = `<text x="${x0 + w / 2}" y="${y0 + 16}" text-anchor="middle" font-size="13">${title}</text>`;
  out += `<line x1="${sx(0)}" y1="${sy(0)}" x2="${sx(xMax)}" y2="${sy(0)}" stroke="#888"/>`;
  out += `<line x1="${sx(0)}" y1="${sy(0)}" x2="${sx(0)}" y2="${sy(yMax)}" stroke="#888"/>`;
  for (const f of [0, 0.5, 1]) {
    const y = yMax * f;
    out += `<text x="${sx(0) - 4}" y="${sy(y) + 4}" text-anchor="end" font-size="10">${y.toFixed(2)}</text>`;
  }
  out += `<text x="${sx(xMax)}" y="${sy(0) + 14}" text-anchor="end" font-size="10">step ${xMax}</text>`;
  series.forEach((s, i) => {
    if (s.points.length === 0) return;
    const d = s.points
      .map(([x, y], j) => `${j === 0 ? 'M' : 'L'}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`)
      .join(' ');
    const c = COLORS[i % COLORS.length];
    out += `<path d="${d}" fill="none" stroke="${c}" stroke-width="1.8"/>`;
    if (s.points.length < 12)
      for (const [x, y] of s.points) out += `<circle cx="${sx(x)}" cy="${sy(y)}" r="3" fill="${c}"/>`;
  });
  return out;
}

/** SVG comparing runs: training reward, held-out accuracy, tool-error ratio among positives (smoothed). */
export function plotRuns(runDirs: string[], labels = runDirs.map((d) => basename(d))): string {
  const runs = runDirs.map((dir, i) => {
    const m = readJsonlTolerant<Record<string, any>>(join(dir, 'metrics.jsonl')).filter(
      (r) => 'reward_mean' in r,
    );
    const ev = readJsonlTolerant<Record<string, any>>(join(dir, 'evals.jsonl'));
    // RL steps numbered across stages, in file order
    const offset = new Map<string, number>();
    let base = 0;
    for (const r of m) {
      if (offset.has(r.stage)) continue;
      offset.set(r.stage, base);
      base += m.filter((x) => x.stage === r.stage).length;
    }
    const xOf = (stage: string, step: number) => (offset.get(stage) ?? 0) + step;
    return {
      label: labels[i],
      reward: m.map((r) => [xOf(r.stage, r.step), r.reward_mean] as [number, number]),
      err: m.map((r) => [xOf(r.stage, r.step), r.tool_error_ratio_pos] as [number, number]),
      acc: ev
        .filter((e) => offset.has(e.stage))
        .map((e) => [xOf(e.stage, e.step), e.accuracy] as [number, number]),
    };
  });
  const W = 360;
  const H = 260;
  const panels = [
    panel(
      'training reward (mean)',
      runs.map((r) => ({ label: r.label, points: smooth(r.reward, 3) })),
      0,
      0,
      W,
      H,
    ),
    panel(
      'held-out accuracy',
      runs.map((r) => ({ label: r.label, points: r.acc })),
      W,
      0,
      W,
      H,
    ),
    panel(
      'tool-error ratio among positives',
      runs.map((r) => ({ label: r.label, points: smooth(r.err, 5) })),
      2 * W,
      0,
      W,
      H,
    ),
  ];
  const perRow = Math.floor((3 * W - 20) / LEGEND_W);
  const legend = runs
    .map((r, i) => {
      const x = 20 + (i % perRow) * LEGEND_W;
      const y = H + 8 + Math.floor(i / perRow) * 20;
      return `<rect x="${x}" y="${y}" width="12" height="12" fill="${COLORS[i % COLORS.length]}"/><text x="${x + 18}" y="${y + 11}" font-size="12">${r.label.replace(/[<&>]/g, '')}</text>`;
    })
    .join('');
  const height = H + 10 + Math.ceil(runs.length / perRow) * 20;
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${3 * W}" height="${height}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>${panels.join('')}${legend}</svg>\n`;
}
