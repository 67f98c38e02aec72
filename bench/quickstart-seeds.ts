// Seed sweep of a recipe (default: the quickstart), run as a user runs it: one `rstar2 train --seed N` process
// per seed. Prints, per seed, each SFT stage's end loss and gate, held-out accuracy after SFT and at every RL
// evaluation, health warnings and wall time; then medians and ranges. With --ablation each seed's run is
// forked after its last SFT checkpoint with --roc off, and the tool-error ratio among positives over the
// second half of RL and over all of it is compared (RoC should be lower).
//
//   npx tsx bench/quickstart-seeds.ts --seeds 1,2,3,4,5 [--ablation] [--out runs/seeds] [--recipe quickstart]
//                                     [--jobs 1] [--set path=value ...] [--report] [--ablation-only]
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { readJsonlTolerant } from '../src/util/jsonl.js';
import { benchArgs } from './args.js';

const { values } = benchArgs(import.meta.url, {
  options: {
    seeds: { type: 'string', default: '1,2,3,4,5' },
    recipe: { type: 'string', default: 'quickstart' },
    out: { type: 'string', default: 'runs/seeds' },
    jobs: { type: 'string', default: '1' },
    ablation: { type: 'boolean', default: false },
    // run only the RoC-off arms, forked from the finished runs already in --out (time each seed's run alone
    // first, then its ablation arms, several at a time with --jobs)
    'ablation-only': { type: 'boolean', default: false },
    // re-print the table of runs already in --out, without training (minutes then span the metrics' timestamps)
    report: { type: 'boolean', default: false },
    set: { type: 'string', multiple: true, default: [] },
  },
});
const seeds = values.seeds.split(',').map((s) => {
  if (!/^-?\d+$/.test(s.trim())) throw new Error(`--seeds: '${s}' is not an integer`);
  return Number(s);
});
const ablation = values.ablation || values['ablation-only'];
const jobs = Number(values.jobs);
if (!(Number.isInteger(jobs) && jobs >= 1)) throw new Error(`--jobs must be an integer >= 1`);
const bin = join(import.meta.dirname, '..', 'bin', 'rstar2.js');
mkdirSync(values.out, { recursive: true });

type Rec = Record<string, any>;

type Load = { mean: number; max: number };

function mean(xs: number[]): number {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : Number.NaN;
}

// The host's 1-minute load average, sampled every 30 s while a run trains: a run alone holds it near its 2
// threads, so a mean well above the core count says its wall time was shared with other work.
function train(args: string[], log: string): Promise<{ code: number; seconds: number; load: Load }> {
  const t0 = Date.now();
  const samples = [loadavg()[0]];
  const timer = setInterval(() => samples.push(loadavg()[0]), 30_000);
  return new Promise((ok) => {
    const p = spawn(process.execPath, [bin, 'train', ...args], {
      env: { ...process.env, RSTAR2_NO_PROGRESS: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let text = '';
    p.stdout.on('data', (d) => (text += d));
    p.stderr.on('data', (d) => (text += d));
    p.on('close', (code) => {
      clearInterval(timer);
      writeFileSync(log, text);
      const load = { mean: mean(samples), max: Math.max(...samples) };
      ok({ code: code ?? 1, seconds: (Date.now() - t0) / 1000, load });
    });
  });
}

/** The checkpoint RL started from: the last SFT stage's best check if it went back to one at its cap, else its newest. */
function lastSftCheckpoint(run: string): string {
  const cfg = JSON.parse(readFileSync(join(run, 'config.json'), 'utf8'));
  const firstRl = cfg.stages.findIndex((s: Rec) => s.type === 'rl');
  const sft = cfg.stages[firstRl - 1];
  if (sft?.type !== 'sft') throw new Error(`${run}: no SFT stage before the first RL stage`);
  const restored = readJsonlTolerant<Rec>(join(run, 'metrics.jsonl')).findLast(
    (r) => r.stage === sft.name && r.restored != null,
  )?.restored;
  if (restored != null)
    return join(run, 'checkpoints', `${sft.name}-step-${String(restored).padStart(6, '0')}`);
  const ckpts = readdirSync(join(run, 'checkpoints'))
    .filter((n) => n.startsWith(`${sft.name}-step-`))
    .sort();
  if (ckpts.length === 0) throw new Error(`${run}: no checkpoint of stage ${sft.name}`);
  return join(run, 'checkpoints', ckpts[ckpts.length - 1]);
}

function summarise(run: string) {
  const m = readJsonlTolerant<Rec>(join(run, 'metrics.jsonl'));
  const evals = readJsonlTolerant<Rec>(join(run, 'evals.jsonl'));
  const cfg = JSON.parse(readFileSync(join(run, 'config.json'), 'utf8'));
  const sft = cfg.stages
    .filter((s: Rec) => s.type === 'sft')
    .map((s: Rec) => {
      const rows = m.filter((r) => r.stage === s.name);
      const last = rows[rows.length - 1] ?? {};
      const checks = rows.filter((r) => r.heldout_loss !== undefined);
      // as the trainer picks it: higher exact, a tie to the lower held-out loss
      const best = checks.reduce(
        (a: Rec | undefined, r) =>
          a &&
          (a.heldout_exact > r.heldout_exact ||
            (a.heldout_exact === r.heldout_exact && a.heldout_loss <= r.heldout_loss))
            ? a
            : r,
        undefined,
      );
      const reached = rows.some((r) => r.gate === 'reached');
      // a capped stage with restoreBest goes on from its best check: that is what RL starts from
      const restored = !reached && s.gate?.restoreBest && best;
      const check = restored ? best : checks.pop();
      const gate = !s.gate
        ? '-'
        : reached
          ? `@${last.step}`
          : restored
            ? `MISSED, best @${best.step}`
            : 'MISSED';
      return {
        stage: s.name,
        steps: last.step ?? 0,
        loss: last.loss,
        gate,
        ...(check ? { heldoutLoss: check.heldout_loss, heldoutExact: check.heldout_exact } : {}),
      };
    });
  const rl = m.filter((r) => cfg.stages.find((s: Rec) => s.name === r.stage)?.type === 'rl');
  const half = rl.slice(Math.floor(rl.length / 2));
  return {
    sft,
    evals: evals.map((e) => ({ step: `${e.stage}:${e.step}`, accuracy: e.accuracy })),
    toolErrPosLateHalf: mean(half.map((r) => r.tool_error_ratio_pos)),
    toolErrPosAll: mean(rl.map((r) => r.tool_error_ratio_pos)),
    warnings: m.flatMap((r) => (r.health ?? []).map((w: Rec) => w.code)),
  };
}

async function pool<T>(items: T[], n: number, f: (x: T) => Promise<void>): Promise<void> {
  const queue = [...items];
  await Promise.all(
    Array.from({ length: Math.min(n, items.length) }, async () => {
      for (let x = queue.shift(); x !== undefined; x = queue.shift()) await f(x);
    }),
  );
}

const sets = values.set.flatMap((s) => ['--set', s]);
console.log(
  `# seed sweep: recipe ${values.recipe}, seeds ${seeds.join(',')}, ${jobs} at a time, ` +
    `host CPU ${cpus()[0]?.model ?? '?'} × ${cpus().length}${ablation ? ', with RoC-off ablation' : ''}`,
);
const rows: Rec[] = [];
// a fork's metrics.jsonl starts with its parent's records: only its own (RL) stage counts for its time
const spanMinutes = (run: string, rlOnly = false) => {
  const cfg = JSON.parse(readFileSync(join(run, 'config.json'), 'utf8'));
  const rl = new Set(cfg.stages.filter((s: Rec) => s.type === 'rl').map((s: Rec) => s.name));
  const t = readJsonlTolerant<Rec>(join(run, 'metrics.jsonl'))
    .filter((r) => !rlOnly || rl.has(r.stage))
    .map((r) => Date.parse(r.time));
  return t.length ? (Math.max(...t) - Math.min(...t)) / 60_000 : Number.NaN;
};
// --report keeps the host load the sweep recorded, where its summary.json has it
const recorded: Rec[] =
  values.report && existsSync(join(values.out, 'summary.json'))
    ? JSON.parse(readFileSync(join(values.out, 'summary.json'), 'utf8'))
    : [];
await pool(seeds, jobs, async (seed) => {
  const run = join(values.out, `seed-${seed}`);
  if (values.report) {
    const load = recorded.find((r) => r.seed === seed)?.load;
    const row: Rec = { seed, code: 0, minutes: spanMinutes(run), load, ...summarise(run) };
    const off = `${run}-grpo`;
    if (ablation && existsSync(join(off, 'metrics.jsonl')))
      row.grpo = { code: 0, minutes: spanMinutes(off, true), ...summarise(off) };
    rows.push(row);
    return;
  }
  let r: { code: number; seconds: number; load?: Load };
  if (values['ablation-only']) {
    if (!existsSync(join(run, 'metrics.jsonl')))
      throw new Error(`--ablation-only: no finished run in ${run}`);
    r = { code: 0, seconds: spanMinutes(run) * 60 };
  } else {
    if (existsSync(join(run, 'state.json')))
      throw new Error(`${run} holds a run already: pick another --out`);
    r = await train(['--recipe', values.recipe, '--seed', String(seed), '--out', run, ...sets], `${run}.log`);
  }
  const row: Rec = { seed, code: r.code, minutes: r.seconds / 60, load: r.load, ...summarise(run) };
  if (ablation && r.code === 0) {
    const off = `${run}-grpo`;
    const a = await train(
      [
        '--recipe',
        values.recipe,
        '--seed',
        String(seed),
        '--roc',
        'off',
        '--fork',
        lastSftCheckpoint(run),
        '--out',
        off,
        ...sets,
      ],
      `${off}.log`,
    );
    row.grpo = { code: a.code, minutes: a.seconds / 60, load: a.load, ...summarise(off) };
  }
  rows.push(row);
  // a sweep takes hours on a shared host: what finished is on disk before the rest does
  if (!values.report)
    writeFileSync(
      join(values.out, 'summary.json'),
      JSON.stringify(
        [...rows].sort((a, b) => a.seed - b.seed),
        null,
        2,
      ) + '\n',
    );
  console.error(`seed ${seed} done in ${(r.seconds / 60).toFixed(1)} min (exit ${r.code})`);
});
rows.sort((a, b) => a.seed - b.seed);

// each health warning once, with how many steps raised it
const counted = (codes: string[]) => {
  const n = new Map<string, number>();
  for (const c of codes) n.set(c, (n.get(c) ?? 0) + 1);
  return [...n].map(([c, k]) => (k > 1 ? `${c} ×${k}` : c)).join(', ');
};
const pct = (x: number | undefined) => (typeof x === 'number' ? `${Math.round(x * 100)}%` : '-');
const f3 = (x: number | undefined) => (typeof x === 'number' && Number.isFinite(x) ? x.toFixed(3) : '-');
console.log(
  '\n| seed | SFT stages: end loss (gate) | held-out after SFT → RL evals | gain | health | min | host load, mean / max |' +
    (ablation ? ' tool-err pos, RL 2nd half: RoC / GRPO | all RL steps: RoC / GRPO |' : ''),
);
console.log(`|---|---|---|---|---|---|---|${ablation ? '---|---|' : ''}`);
const gains: number[] = [];
const minutes: number[] = [];
let rocWins = 0;
let rocWinsAll = 0;
for (const r of rows) {
  const accs = r.evals.map((e: Rec) => e.accuracy);
  const gain = accs.length ? accs[accs.length - 1] - accs[0] : Number.NaN;
  gains.push(gain);
  minutes.push(r.minutes);
  const sft = r.sft
    .map(
      (s: Rec) =>
        `${s.stage} ${f3(s.loss)} (${s.gate}${s.heldoutExact !== undefined ? `, exact ${f3(s.heldoutExact)}` : ''})`,
    )
    .join(', ');
  let abl = '';
  if (ablation) {
    const on = r.toolErrPosLateHalf;
    const off = r.grpo?.toolErrPosLateHalf;
    if (on < off) rocWins++;
    if (r.toolErrPosAll < r.grpo?.toolErrPosAll) rocWinsAll++;
    abl = ` ${f3(on)} / ${f3(off)} | ${f3(r.toolErrPosAll)} / ${f3(r.grpo?.toolErrPosAll)} |`;
  }
  console.log(
    `| ${r.seed} | ${sft} | ${accs.map(pct).join(' → ')} | ${gain >= 0 ? '+' : ''}${Math.round(gain * 100)} | ` +
      `${r.warnings.length ? counted(r.warnings) : 'ok'}${r.code ? ` (exit ${r.code})` : ''} | ${r.minutes.toFixed(1)} | ${r.load ? `${r.load.mean.toFixed(1)} / ${r.load.max.toFixed(1)}` : '-'} |${abl}`,
  );
}
const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)];
const range = (xs: number[], f: (x: number) => string) => `${f(Math.min(...xs))}–${f(Math.max(...xs))}`;
console.log(
  `\nheld-out gain: median +${Math.round(med(gains) * 100)} points (range ${range(gains, (x) => `${Math.round(x * 100)}`)}); ` +
    `wall time median ${med(minutes).toFixed(1)} min (range ${range(minutes, (x) => x.toFixed(1))}); ` +
    `no health warning on ${rows.filter((r) => r.warnings.length === 0 && r.code === 0).length}/${rows.length} seeds` +
    (ablation
      ? `; RoC below GRPO on ${rocWins}/${rows.length} seeds (RL 2nd half), ${rocWinsAll}/${rows.length} (all RL steps)`
      : ''),
);
writeFileSync(join(values.out, 'summary.json'), JSON.stringify(rows, null, 2) + '\n');
