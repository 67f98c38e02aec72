// Draws docs/figures/overview.svg from recorded results only: the quickstart's held-out accuracy over RL for each
// seed of the committed recipe (data/recipes/quickstart-results/summary-2026-11-27-night.json, 2-core AMD EPYC),
// and the worker against transformers on one H200 (bench/samples/h200-train-bench-2026-11-27b.json and
// h200-engine-bench*.json). Usage: npx tsx scripts/gen-figure.ts
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
export const FIGURE = join(ROOT, 'docs/figures/overview.svg');
const SEEDS = 'data/recipes/quickstart-results/summary-2026-11-27-night.json';
const TRAIN = 'bench/samples/h200-train-bench-2026-11-27b.json';
const ENGINE = 'bench/samples/h200-engine-bench.json';
const ENGINE_COMPILED = 'bench/samples/h200-engine-bench-compile.json';

const read = (p: string) => JSON.parse(readFileSync(join(ROOT, p), 'utf8'));
const PALETTE = [
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
const OURS = '#1f77b4';
const PEER = '#bbbbbb';
const r1 = (x: number) => Math.round(x * 10) / 10;
const text = (x: number, y: number, s: string, attrs = '') =>
  `<text x="${r1(x)}" y="${r1(y)}" ${attrs.includes('font-size') ? '' : 'font-size="11" '}${attrs}>${s.replace(/&/g, '&amp;').replace(/</g, '&lt;')}</text>`;

interface Panel {
  x: number;
  y: number;
  w: number;
  h: number;
}

function axes(p: Panel, title: string, yTicks: [number, string][], yOf: (v: number) => number): string[] {
  const out = [
    text(p.x + p.w / 2, p.y - 12, title, 'text-anchor="middle" font-size="12" font-weight="bold"'),
  ];
  out.push(`<line x1="${p.x}" y1="${p.y + p.h}" x2="${p.x + p.w}" y2="${p.y + p.h}" stroke="#888"/>`);
  out.push(`<line x1="${p.x}" y1="${p.y}" x2="${p.x}" y2="${p.y + p.h}" stroke="#888"/>`);
  for (const [v, label] of yTicks) {
    const y = yOf(v);
    out.push(`<line x1="${p.x}" y1="${r1(y)}" x2="${p.x + p.w}" y2="${r1(y)}" stroke="#eee"/>`);
    out.push(text(p.x - 4, y + 4, label, 'text-anchor="end"'));
  }
  return out;
}

/** Held-out accuracy at RL steps 0, 4, …, 20, one line per seed, the median over seeds in black. */
function seedsPanel(p: Panel): string[] {
  const runs = read(SEEDS) as { seed: number; evals: { step: string; accuracy: number }[] }[];
  const steps = runs[0].evals.map((e) => Number(e.step.split(':')[1]));
  const xOf = (s: number) => p.x + (s / steps[steps.length - 1]) * p.w;
  const yOf = (a: number) => p.y + p.h - a * p.h;
  const out = axes(
    p,
    `quickstart: held-out accuracy over RL, ${runs.length} seeds (CPU)`,
    [0, 0.25, 0.5, 0.75, 1].map((v) => [v, `${v * 100} %`]),
    yOf,
  );
  for (const s of steps) out.push(text(xOf(s), p.y + p.h + 14, String(s), 'text-anchor="middle"'));
  out.push(text(p.x + p.w / 2, p.y + p.h + 30, 'RL step (after the two SFT stages)', 'text-anchor="middle"'));
  for (const [i, r] of runs.entries()) {
    const d = r.evals.map((e, j) => `${j ? 'L' : 'M'}${r1(xOf(steps[j]))},${r1(yOf(e.accuracy))}`).join(' ');
    out.push(
      `<path d="${d}" fill="none" stroke="${PALETTE[i % PALETTE.length]}" stroke-width="1.3" opacity="0.75"/>`,
    );
  }
  const median = steps.map((_, j) => {
    const v = runs.map((r) => r.evals[j].accuracy).sort((a, b) => a - b);
    return (v[(v.length - 1) >> 1] + v[v.length >> 1]) / 2;
  });
  const d = median.map((a, j) => `${j ? 'L' : 'M'}${r1(xOf(steps[j]))},${r1(yOf(a))}`).join(' ');
  out.push(`<path d="${d}" fill="none" stroke="black" stroke-width="2.5"/>`);
  out.push(text(p.x + 8, p.y + 14, 'black: median over seeds', ''));
  out.push(
    text(p.x, p.y + p.h + 48, '2-core AMD EPYC, no GPU, 2026-11-27; avg@2 pass@1 at T = 0.6', 'fill="#555"'),
  );
  return out;
}

interface Bar {
  label: string;
  ours: number;
  peer: number;
}

/** Paired bars, ours against the peer, on a linear or log scale, each labelled with its value. */
function barsPanel(
  p: Panel,
  title: string,
  bars: Bar[],
  log: boolean,
  note: string,
  legend: [string, string],
): string[] {
  const top = Math.max(...bars.flatMap((b) => [b.ours, b.peer]));
  const lo = log ? 10 : 0;
  const hi = log ? 10 ** Math.ceil(Math.log10(top)) : Math.ceil(top / 10_000) * 10_000;
  const f = (v: number) =>
    log ? (Math.log10(v) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo)) : v / hi;
  const yOf = (v: number) => p.y + p.h - f(v) * p.h;
  const ticks: [number, string][] = log
    ? Array.from({ length: Math.log10(hi) - Math.log10(lo) + 1 }, (_, i) => {
        const v = lo * 10 ** i;
        return [v, v >= 1000 ? `${v / 1000}k` : String(v)];
      })
    : [0, hi / 2, hi].map((v) => [v, `${v / 1000}k`]);
  const out = axes(p, title, ticks, yOf);
  const slot = p.w / bars.length;
  const bw = slot * 0.32;
  const fmt = (v: number) => (v >= 1000 ? `${r1(v / 1000)}k` : String(Math.round(v)));
  for (const [i, b] of bars.entries()) {
    const cx = p.x + slot * (i + 0.5);
    for (const [j, v] of [b.ours, b.peer].entries()) {
      const x = cx - bw + j * bw;
      const y = yOf(v);
      out.push(
        `<rect x="${r1(x)}" y="${r1(y)}" width="${r1(bw - 2)}" height="${r1(p.y + p.h - y)}" fill="${j ? PEER : OURS}"/>`,
      );
      out.push(text(x + (bw - 2) / 2, y - 3, fmt(v), 'text-anchor="middle" font-size="10"'));
    }
    out.push(text(cx, p.y + p.h + 14, b.label, 'text-anchor="middle"'));
  }
  for (const [j, name] of legend.entries()) {
    const y = p.y + p.h + 24 + j * 15;
    out.push(`<rect x="${p.x}" y="${y}" width="10" height="10" fill="${j ? PEER : OURS}"/>`);
    out.push(text(p.x + 14, y + 9, name));
  }
  out.push(text(p.x, p.y + p.h + 66, note, 'fill="#555"'));
  return out;
}

function trainBars(): Bar[] {
  const cases = read(TRAIN).cases as Record<
    string,
    { worker: { tokensPerS: number }; transformers?: { tokensPerS: number } }
  >;
  const names: [string, string][] = [
    ['0.5b-bf16', '0.5B bf16'],
    ['0.5b-bf16-mixed', '0.5B bf16-mixed'],
    ['3b-bf16', '3B bf16'],
  ];
  return names.map(([k, label]) => ({
    label,
    ours: cases[k].worker.tokensPerS,
    peer: cases[k].transformers?.tokensPerS ?? Number.NaN,
  }));
}

function engineBars(): Bar[] {
  const plain = read(ENGINE) as {
    decode: { batch: number; tok_s: number }[];
    hf: { batch: number; cache: string; tok_s: number }[];
  };
  const compiled = read(ENGINE_COMPILED) as { decode: { batch: number; tok_s: number }[] };
  return [1, 128].map((batch) => ({
    label: `batch ${batch}`,
    ours: (compiled.decode.find((d) => d.batch === batch) ?? plain.decode.find((d) => d.batch === batch))!
      .tok_s,
    peer: plain.hf.find((h) => h.batch === batch && h.cache === 'static')!.tok_s,
  }));
}

export function renderFigure(): string {
  const W = 1200;
  const H = 350;
  const body = [
    ...seedsPanel({ x: 60, y: 40, w: 400, h: 200 }),
    ...barsPanel(
      { x: 560, y: 40, w: 270, h: 200 },
      'train step, tokens/s (one H200)',
      trainBars(),
      false,
      '8,192-token sequence, median of 5 steps',
      ['rstar2 worker', 'transformers + AdamW loop'],
    ),
    ...barsPanel(
      { x: 910, y: 40, w: 250, h: 200 },
      'generation, tokens/s (one H200, log)',
      engineBars(),
      true,
      '0.5B shape, 256-token prompts, bf16',
      ['built-in engine', 'transformers generate (static cache)'],
    ),
    text(
      60,
      H - 10,
      'from data/recipes/quickstart-results/summary-2026-11-27-night.json, bench/samples/h200-train-bench-2026-11-27b.json, bench/samples/h200-engine-bench*.json',
      'fill="#555" font-size="10"',
    ),
  ];
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif">`,
    '<rect width="100%" height="100%" fill="white"/>',
    ...body,
    '</svg>',
    '',
  ].join('\n');
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  mkdirSync(dirname(FIGURE), { recursive: true });
  writeFileSync(FIGURE, renderFigure());
  console.log(`wrote ${FIGURE}`);
}
