// rstar2 dashboard client: plain DOM + uPlot (loaded before this file), no build step. Polls the JSON API for live updates.
const POLL_MS = Number(document.body.dataset.pollMs || 2000);
const COLORS = ['#2f6fed', '#1f9d55', '#d68a1f', '#d64545', '#7a4fd6', '#17a2b8', '#8a6d3b'];
const state = {
  list: [],
  sel: null, // {kind, name}
  compare: new Set(),
  data: null,
  dataKey: '',
  trajFile: null,
  filter: 'all',
  trajId: null,
  trajKey: '',
  stage: null,
  stagePinned: false,
};

const $ = (s) => document.querySelector(s);
// Run directories are files anyone may have edited: every value that reaches innerHTML goes through
// esc, numbers included (a "number" field may hold markup), or through fmt/pct, which print numbers only.
const esc = (s) =>
  String(s ?? '').replace(
    /[&<>"']/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c],
  );
const pct = (x) => (typeof x !== 'number' || Number.isNaN(x) ? '–' : `${(100 * x).toFixed(1)}%`);
const fmt = (x, d = 3) => {
  if (typeof x !== 'number' || Number.isNaN(x)) return '–';
  const a = Math.abs(x);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return x.toExponential(2);
  return Number.isInteger(x) ? String(x) : x.toFixed(a >= 100 ? 0 : d);
};

// The dashboard's token, when it has one, comes in the page's own URL (?token=, printed by the CLI).
const TOKEN = new URLSearchParams(location.search).get('token');

async function api(path) {
  const headers = TOKEN ? { authorization: `Bearer ${TOKEN}` } : {};
  const r = await fetch(path, { cache: 'no-store', headers });
  if (!r.ok) throw new Error(`${path}: ${r.status} ${await r.text()}`);
  return r.json();
}

// ---------- charts ----------
// uPlot (canvas): hover shows every series' value in the legend, drag zooms, double-click resets, a
// legend click hides a series. Cursor and zoom follow across panels (one sync key: they share the step
// axis). Charts live across polls and get new data with setData, so zoom and hidden series survive.
const charts = new Map(); // chart id → {el, plot, u, key, raw, stacked}
const STEP_INCRS = [1, 2, 5]
  .flatMap((m) => [1, 10, 100, 1e3, 1e4, 1e5].map((p) => m * p))
  .sort((a, b) => a - b);

// [steps, ...values] over the union of the series' steps, null where a series has no value
function align(series) {
  const xs = [...new Set(series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
  return [
    xs,
    ...series.map((s) => {
      const at = new Map(s.points);
      return xs.map((x) => at.get(x) ?? null);
    }),
  ];
}

// Cumulative sums over the shown series, each filled down to the shown one below it (the time split).
function stack(raw, shown) {
  const acc = raw[0].map(() => 0);
  const bands = [];
  let below = 0;
  const data = raw.map((ys, i) => {
    if (i === 0 || !shown[i]) return ys;
    if (below) bands.push({ series: [i, below] });
    below = i;
    return ys.map((v, j) => (v == null ? null : (acc[j] += v)));
  });
  return { data, bands };
}

function setChartData(rec) {
  const u = rec.u;
  let data = rec.raw;
  if (rec.stacked) {
    const s = stack(
      rec.raw,
      u.series.map((x) => x.show),
    );
    u.delBand(null);
    for (const b of s.bands) u.addBand(b);
    data = s.data;
  }
  const xs = u.data[0];
  const { min, max } = u.scales.x;
  const zoomed = xs.length > 0 && (min > xs[0] || max < xs[xs.length - 1]);
  u.setData(data);
  if (zoomed) u.setScale('x', { min, max });
}

function fitChart(rec) {
  const width = rec.plot.clientWidth;
  if (width > 0 && width !== rec.u.width) rec.u.setSize({ width, height: 190 });
}
// deferred a frame: resizing inside the observer would resize what it observes (a loop error)
new ResizeObserver(() => requestAnimationFrame(() => charts.forEach(fitChart))).observe($('#charts'));

function chartOptions(rec, spec) {
  const { opts } = spec;
  // the legend shows each series' own value, not the stacked sum drawn
  const value = (_u, v, si, i) => {
    const y = rec.stacked ? rec.raw[si][i] : v;
    return opts.percent ? pct(y) : fmt(y);
  };
  const range = (_u, lo, hi) => {
    if (lo == null || hi == null) return [0, 1];
    if (opts.zero || opts.stacked) [lo, hi] = [Math.min(0, lo), Math.max(0, hi)];
    // a flat series gets a band around it; one flat at 0 (a tool-error ratio that stays 0) gets 0..1, not a
    // band below 0 (uPlot's own range for all zeros is 0..100)
    if (lo === hi) return lo === 0 ? [0, 1] : [lo - Math.abs(lo) * 0.1, hi + Math.abs(lo) * 0.1];
    let [a, b] = uPlot.rangeNum(lo, hi, 0.1, true);
    // the padding does not take a quantity below 0, or a share above 100 %, that never goes there
    if (lo >= 0) a = Math.max(a, 0);
    if (opts.percent && hi <= 1) b = Math.min(b, 1);
    return [a, b];
  };
  // the y axis as wide as its longest label, so "-0.050" or "-100%" keeps its sign (a fixed 50 px cut it off)
  const ySize = (u, values, i, cycle) => {
    const axis = u.axes[i];
    if (cycle > 1) return axis._size;
    const longest = (values ?? []).reduce((a, v) => (String(v).length > a.length ? String(v) : a), '');
    u.ctx.font = axis.font[0];
    return Math.ceil(axis.ticks.size + axis.gap + u.ctx.measureText(longest).width / uPlot.pxRatio) + 6;
  };
  return {
    width: rec.plot.clientWidth,
    height: 190,
    scales: { x: { time: false }, y: { range } },
    cursor: { sync: { key: 'steps', scales: ['x', null] } },
    axes: [
      { incrs: STEP_INCRS },
      {
        size: ySize,
        ...(opts.percent ? { values: (_u, ys) => ys.map((y) => `${+(100 * y).toFixed(4)}%`) } : {}),
      },
    ],
    series: [
      { label: 'step', value: (_u, x) => fmt(x, 0) },
      ...spec.series.map((s, i) => {
        const color = s.color || COLORS[i % COLORS.length];
        return {
          label: s.name,
          stroke: color,
          width: 1.8,
          spanGaps: true,
          value,
          ...(s.dashed ? { dash: [4, 3], points: { show: true } } : {}),
          ...(opts.stacked ? { fill: `${color}59` } : {}),
        };
      }),
    ],
    hooks: opts.stacked ? { setSeries: [() => setChartData(rec)] } : {},
  };
}

// specs: [{id, title, series: [{name, points: [[step, y]], color?, dashed?}], opts: {stacked, percent, zero}}]
function drawCharts(specs) {
  const box = $('#charts');
  specs = specs
    .map((c) => ({ ...c, series: c.series.filter((s) => s.points.length > 0) }))
    .filter((c) => c.series.length > 0);
  const drop = (id) => {
    charts.get(id).u.destroy();
    charts.get(id).el.remove();
    charts.delete(id);
  };
  for (const id of charts.keys()) if (!specs.some((c) => c.id === id)) drop(id);
  box.querySelector('.placeholder')?.remove();
  if (specs.length === 0)
    box.innerHTML = '<div class="placeholder">no metrics yet — waiting for metrics.jsonl</div>';
  for (const spec of specs) {
    // another run, stage or set of series starts a fresh chart (unzoomed, every series shown)
    const key = JSON.stringify([state.sel?.name, state.stage, spec.series.map((s) => s.name)]);
    if (charts.get(spec.id)?.key !== key) {
      if (charts.has(spec.id)) drop(spec.id);
      const el = document.createElement('div');
      el.className = 'chart';
      el.dataset.chart = spec.id;
      const title = document.createElement('h4');
      title.textContent = spec.title;
      const plot = document.createElement('div');
      el.append(title, plot);
      box.append(el);
      const rec = { el, plot, key, stacked: Boolean(spec.opts.stacked) };
      rec.u = new uPlot(chartOptions(rec, spec), [[], ...spec.series.map(() => [])], plot);
      charts.set(spec.id, rec);
    }
    const rec = charts.get(spec.id);
    box.append(rec.el); // keeps the panels in spec order
    rec.raw = align(spec.series);
    fitChart(rec);
    setChartData(rec);
  }
}

const chart = (id, title, series, opts = {}) => ({ id, title, series, opts });

const get = (o, path) => path.split('.').reduce((a, k) => (a == null ? undefined : a[k]), o);

function seriesOf(metrics, path, name, extra = {}) {
  const points = [];
  metrics.forEach((m, i) => {
    const v = get(m, path);
    if (typeof v === 'number' && Number.isFinite(v))
      points.push([typeof m.step === 'number' ? m.step : i + 1, v]);
  });
  return { name, points, ...extra };
}

// ---------- sidebar ----------
function renderList() {
  const runs = state.list.filter((e) => e.kind === 'run');
  const evals = state.list.filter((e) => e.kind === 'eval');
  const item = (e) => {
    const sel = state.sel && state.sel.kind === e.kind && state.sel.name === e.name ? ' sel' : '';
    const box =
      e.kind === 'eval'
        ? `<input type="checkbox" data-compare="${esc(e.name)}" ${state.compare.has(e.name) ? 'checked' : ''} title="compare side by side">`
        : '';
    const st = e.status ? ` data-status="${esc(e.status)}"` : '';
    return `<li class="entry${sel}" data-kind="${esc(e.kind)}" data-name="${esc(e.name)}"${st}>${box}<span>${esc(e.name)}</span><span class="sub">${esc(e.sub || '')}</span></li>`;
  };
  $('#runs').innerHTML = runs.map(item).join('') || '<div class="empty">no run directories</div>';
  $('#evals').innerHTML = evals.map(item).join('') || '<div class="empty">no eval directories</div>';
}

document.addEventListener('click', (ev) => {
  const box = ev.target.closest('[data-compare]');
  if (box) {
    const n = box.dataset.compare;
    if (box.checked) state.compare.add(n);
    else state.compare.delete(n);
    renderCompare();
    ev.stopPropagation();
    return;
  }
  const li = ev.target.closest('li.entry');
  if (li) select({ kind: li.dataset.kind, name: li.dataset.name });
  const sb = ev.target.closest('[data-stage]');
  if (sb && state.data) {
    state.stage = sb.dataset.stage;
    state.stagePinned = true;
    renderRun(state.data);
  }
  const fb = ev.target.closest('[data-filter]');
  if (fb) {
    state.filter = fb.dataset.filter;
    state.trajId = null;
    loadTrajList();
  }
  const tr = ev.target.closest('li[data-traj]');
  if (tr) {
    state.trajId = tr.dataset.traj;
    for (const x of document.querySelectorAll('#traj-list li')) x.classList.toggle('sel', x === tr);
    loadTraj();
  }
});

async function select(sel) {
  state.sel = sel;
  state.dataKey = '';
  state.trajFile = null;
  state.trajId = null;
  state.filter = 'all';
  state.stagePinned = false;
  if (sel.kind === 'eval') state.compare.add(sel.name);
  renderList();
  await refreshSelected();
  renderCompare();
}

// ---------- run / eval view ----------
function stat(label, value) {
  return `<div class="stat"><b>${esc(value)}</b><span>${esc(label)}</span></div>`;
}

// Contiguous runs of one stage (sft, rl, rl again…): each has its own step axis.
function stageSegments(metrics) {
  const segs = [];
  const seen = {};
  for (const row of metrics) {
    const name = row.stage ?? 'train';
    let seg = segs[segs.length - 1];
    if (!seg || seg.name !== name) {
      seen[name] = (seen[name] || 0) + 1;
      seg = {
        key: `${name}#${seen[name]}`,
        name,
        label: seen[name] > 1 ? `${name} (${seen[name]})` : name,
        rows: [],
      };
      segs.push(seg);
    }
    seg.rows.push(row);
  }
  return segs;
}

function renderRun(d) {
  const segs = stageSegments(d.metrics);
  if (!state.stagePinned || !segs.some((g) => g.key === state.stage))
    state.stage = segs[segs.length - 1]?.key ?? null;
  const seg = segs.find((g) => g.key === state.stage);
  const m = seg ? seg.rows : [];
  $('#stage-tabs').innerHTML =
    segs.length > 1
      ? `Stage: ${segs.map((g) => `<button data-stage="${esc(g.key)}" class="${g.key === state.stage ? 'on' : ''}">${esc(g.label)} (${esc(g.rows.length)})</button>`).join('')}`
      : '';
  const last = m[m.length - 1] || {};
  const heldPts = d.evals
    .filter((e) => seg && (e.stage ?? seg.name) === seg.name && typeof e.accuracy === 'number')
    .map((e, i) => [typeof e.step === 'number' ? e.step : i, e.accuracy]);
  const skipped = d.skipped?.length
    ? ` · ${esc(d.skipped.length)} unreadable line(s) left out: ${esc(d.skipped.slice(0, 3).join(', '))}`
    : '';
  $('#run-title').innerHTML =
    `${esc(d.name)} <span class="sub">${esc(d.metrics.length)} steps${d.state?.step != null ? ` · last checkpoint ${esc(d.state.stage ?? '')} step ${esc(d.state.step)}` : ''}${skipped}</span>`;
  // the trainer's health warnings (recipe/health.ts), newest last, across every stage
  const warnings = d.metrics.flatMap((r) =>
    Array.isArray(r.health) ? r.health.map((w) => ({ stage: r.stage, step: r.step, ...w })) : [],
  );
  const health = $('#run-health');
  health.classList.toggle('hidden', warnings.length === 0);
  health.innerHTML = warnings
    .slice(-8)
    .map((w) => `<li><span class="badge warn">${esc(w.code)}</span> ${esc(w.message)}</li>`)
    .join('');
  const stats = [
    ['reward (last)', last.reward_mean, fmt],
    ['accuracy (last)', last.accuracy, pct],
    ['tool-error ratio (pos)', last.tool_error_ratio_pos, pct],
    ['response length', last.response_len_mean, (v) => fmt(v, 0)],
    ['loss (last)', last.loss, fmt],
    ['tokens/s', last.tokens_per_s, (v) => fmt(v, 0)],
  ].filter(([, v]) => typeof v === 'number');
  $('#run-stats').innerHTML = [
    stat('stage / step', `${last.stage ?? '–'} / ${last.step ?? '–'}`),
    ...stats.map(([label, v, f]) => stat(label, f(v))),
  ].join('');
  drawCharts([
    chart('reward', 'Reward (mean)', [seriesOf(m, 'reward_mean', 'reward')]),
    chart(
      'accuracy',
      'Accuracy',
      [
        seriesOf(m, 'accuracy', 'train accuracy'),
        { name: 'held-out', points: heldPts, dashed: true, color: '#d64545' },
      ],
      { percent: true },
    ),
    chart(
      'tool_error',
      'Tool-error ratio among positives',
      [seriesOf(m, 'tool_error_ratio_pos', 'tool errors / calls (correct)')],
      {
        percent: true,
      },
    ),
    chart('length', 'Response length (tokens)', [seriesOf(m, 'response_len_mean', 'mean response tokens')], {
      zero: true,
    }),
    chart(
      'time',
      'Step time split (s)',
      [
        seriesOf(m, 'time_rollout_s', 'rollout'),
        seriesOf(m, 'time_reward_s', 'reward'),
        seriesOf(m, 'time_update_s', 'update'),
      ],
      { stacked: true },
    ),
    chart(
      'rollout',
      'Rollout: makespan and tail (last 10 % of trajectories), s',
      [seriesOf(m, 'rollout.makespan_s', 'makespan'), seriesOf(m, 'rollout.tail_s', 'tail')],
      { zero: true },
    ),
    chart(
      'reprefill',
      'Rollout: re-prefilled tokens (evicted prefixes recomputed)',
      [seriesOf(m, 'rollout.reprefilled_tokens', 're-prefilled tokens')],
      { zero: true },
    ),
    chart('idle', 'Rollout: engine idle share', [seriesOf(m, 'rollout.idle_frac', 'idle')], {
      percent: true,
    }),
    chart(
      'promptshare',
      "Rollout: prompts' share of the length variance (the rest no scheduler can predict)",
      [seriesOf(m, 'rollout.prompt_share', 'prompt share')],
      { percent: true },
    ),
    chart(
      'roc',
      'RoC: trajectories before → after',
      [seriesOf(m, 'roc.before', 'before'), seriesOf(m, 'roc.after', 'after')],
      {
        zero: true,
      },
    ),
    chart(
      'roc_groups',
      'RoC: groups',
      [
        seriesOf(m, 'roc.groups_kept', 'kept'),
        seriesOf(m, 'roc.groups_rejected_all_correct', 'rejected: all correct'),
        seriesOf(m, 'roc.groups_rejected_all_wrong', 'rejected: all wrong'),
      ],
      { zero: true },
    ),
    chart('loss', 'Loss', [seriesOf(m, 'loss', 'loss')]),
    chart('entropy', 'Entropy / clip fraction', [
      seriesOf(m, 'entropy', 'entropy'),
      seriesOf(m, 'clip_frac', 'clip frac'),
    ]),
  ]);
  const rocRows = m
    .filter((x) => x.roc)
    .slice(-200)
    .reverse()
    .map(
      (x) =>
        `<tr><td>${esc(x.stage ?? '')}</td><td class="num">${esc(x.step)}</td><td class="num">${fmt(x.roc.before)}</td><td class="num">${fmt(x.roc.after)}</td><td class="num">${fmt(x.roc.groups_kept)}</td><td class="num">${fmt(x.roc.groups_rejected_all_correct)}</td><td class="num">${fmt(x.roc.groups_rejected_all_wrong)}</td><td class="num">${pct(x.accuracy)}</td><td class="num">${pct(x.tool_error_ratio_pos)}</td></tr>`,
    )
    .join('');
  $('#roc').innerHTML = rocRows
    ? `<div class="scroll"><table><thead><tr><th>stage</th><th class="num">step</th><th class="num">before</th><th class="num">after</th><th class="num">groups kept</th><th class="num">rej. all correct</th><th class="num">rej. all wrong</th><th class="num">accuracy</th><th class="num">tool err (pos)</th></tr></thead><tbody>${rocRows}</tbody></table></div>`
    : '<div class="placeholder">no RoC statistics in this run</div>';
}

function renderEvalOne(d) {
  const r = d.report || {};
  const c = d.config || {};
  $('#eval-title').innerHTML =
    `${esc(d.name)} <span class="sub">${esc(c.bench ?? '')} · ${esc(c.engine ?? '')} · T=${esc(c.temperature)} · top-p=${esc(c.topP)}</span>`;
  $('#eval-stats').innerHTML = [
    stat(`avg@${r.k}`, pct(r.avgAtK)),
    stat(`pass@${r.k}`, pct(r.passAtK?.[String(r.k)])),
    stat(`maj@${r.k}`, pct(r.majAtK)),
    stat('mean response tokens', fmt(r.meanResponseTokens, 0)),
    stat('tool calls / answer', fmt(r.toolCallsPerAnswer, 2)),
    stat('tool-error rate', pct(r.toolErrorRate)),
    stat('samples', `${r.samples ?? 0}${r.complete === false ? ' (incomplete)' : ''}`),
  ].join('');
  const rows = (r.perProblem || [])
    .map(
      (p) =>
        `<tr><td>${esc(p.id)}</td><td>${esc(p.answer)}</td><td class="num">${esc(p.correct)}/${esc(p.n)}</td><td class="num">${pct(p.passAt1)}</td><td>${esc(p.majority ?? '–')} (${esc(p.majorityVotes)})</td><td>${p.majorityCorrect ? '<span class="badge ok">yes</span>' : '<span class="badge bad">no</span>'}</td><td class="num">${fmt(p.meanResponseTokens, 0)}</td><td class="num">${fmt(p.meanToolCalls, 2)}</td></tr>`,
    )
    .join('');
  $('#eval-problems').innerHTML =
    `<div class="scroll"><table><thead><tr><th>problem</th><th>gold</th><th class="num">correct</th><th class="num">pass@1</th><th>majority (votes)</th><th>maj ok</th><th class="num">tokens</th><th class="num">tool calls</th></tr></thead><tbody>${rows}</tbody></table></div>`;
}

async function renderCompare() {
  const names = [...state.compare].filter((n) => state.list.some((e) => e.kind === 'eval' && e.name === n));
  $('#compare-card').classList.toggle('hidden', names.length === 0);
  if (names.length === 0) return;
  const ds = await Promise.all(
    names.map((n) => api(`/api/eval?name=${encodeURIComponent(n)}`).catch(() => null)),
  );
  const cols = ds.filter(Boolean);
  const metric = (label, f, better = 'max', show = pct) => {
    const vals = cols.map((d) => f(d.report || {}, d.config || {}));
    const nums = vals.filter((v) => typeof v === 'number');
    const best =
      better && nums.length > 1 ? (better === 'max' ? Math.max(...nums) : Math.min(...nums)) : null;
    return `<tr><th>${esc(label)}</th>${vals.map((v) => `<td class="num${v === best ? ' best' : ''}">${typeof v === 'number' ? show(v) : esc(v ?? '–')}</td>`).join('')}</tr>`;
  };
  const rows = [
    metric('benchmark', (_r, c) => c.bench, null),
    metric('engine', (_r, c) => c.engine, null),
    metric('k', (r) => r.k, null, String),
    metric('temperature / top-p', (_r, c) => `${c.temperature} / ${c.topP}`, null),
    metric('avg@k (mean pass@1)', (r) => r.avgAtK),
    metric('pass@k', (r) => r.passAtK?.[String(r.k)]),
    metric('maj@k', (r) => r.majAtK),
    metric(
      'mean response tokens',
      (r) => r.meanResponseTokens,
      'min',
      (v) => fmt(v, 0),
    ),
    metric(
      'tool calls / answer',
      (r) => r.toolCallsPerAnswer,
      null,
      (v) => fmt(v, 2),
    ),
    metric('tool-error rate', (r) => r.toolErrorRate, 'min'),
    metric('samples', (r) => r.samples, null, String),
    metric(
      'wall time (s)',
      (r) => r.wallTimeS,
      null,
      (v) => fmt(v, 1),
    ),
  ];
  $('#compare').innerHTML =
    `<table id="compare-table"><thead><tr><th></th>${cols.map((d) => `<th class="num">${esc(d.name)}</th>`).join('')}</tr></thead><tbody>${rows.join('')}</tbody></table>`;
}

async function refreshSelected() {
  const sel = state.sel;
  if (!sel) return;
  const d = await api(`/api/${sel.kind}?name=${encodeURIComponent(sel.name)}`);
  if (state.sel !== sel) return;
  const key = JSON.stringify(d);
  if (key === state.dataKey) return;
  state.dataKey = key;
  state.data = d;
  $('#run-card').classList.toggle('hidden', sel.kind !== 'run');
  $('#eval-card').classList.toggle('hidden', sel.kind !== 'eval');
  $('#traj-card').classList.remove('hidden');
  if (sel.kind === 'run') renderRun(d);
  else renderEvalOne(d);
  const files = d.trajectoryFiles;
  if (!state.trajFile || !files.includes(state.trajFile)) state.trajFile = files[files.length - 1] || null;
  $('#traj-file').innerHTML = files
    .map(
      (f) =>
        `<option value="${esc(f)}" ${f === state.trajFile ? 'selected' : ''}>${esc(f.replace(/^trajectories\//, ''))}</option>`,
    )
    .join('');
  await loadTrajList();
}

$('#traj-file').addEventListener('change', (ev) => {
  state.trajFile = ev.target.value;
  state.trajId = null;
  loadTrajList();
});

// ---------- trajectory viewer ----------
function verdict(t) {
  if (t.correct === true) return '<span class="badge ok">correct</span>';
  if (t.correct === false) return '<span class="badge bad">wrong</span>';
  return '<span class="badge muted">unscored</span>';
}

async function loadTrajList() {
  const sel = state.sel;
  if (!sel || !state.trajFile) {
    $('#traj-list').innerHTML = '';
    $('#traj-detail').innerHTML = '<div class="placeholder">no trajectories saved</div>';
    return;
  }
  const file = state.trajFile;
  const q = `name=${encodeURIComponent(sel.name)}&kind=${sel.kind}&file=${encodeURIComponent(file)}`;
  const d = await api(`/api/trajectories?${q}&filter=${state.filter}&limit=500`);
  // another selection was made meanwhile: this list and its trajectory ids are not its (loading one of them under
  // the new selection asked the server for a file that selection does not have)
  if (state.sel !== sel || state.trajFile !== file) return;
  const labels = { all: 'all', correct: 'correct', incorrect: 'incorrect', tool_error: 'tool error' };
  $('#filters').innerHTML = Object.entries(labels)
    .map(
      ([f, l]) =>
        `<button data-filter="${esc(f)}" class="${state.filter === f ? 'on' : ''}">${esc(l)} (${esc(d.counts[f])})</button>`,
    )
    .join('');
  const key = JSON.stringify([state.trajFile, state.filter, d.items.map((t) => t.id)]);
  if (key === state.trajKey && state.trajId) return;
  state.trajKey = key;
  $('#traj-list').innerHTML =
    d.items
      .map(
        (t) =>
          `<li data-traj="${esc(t.id)}" class="${t.id === state.trajId ? 'sel' : ''}">${verdict(t)}<span class="tid" title="${esc(t.id)}">${esc(t.id)}</span>${t.numToolErrors > 0 ? '<span class="badge warn">tool err</span>' : ''}${t.kept === false ? '<span class="badge muted">dropped</span>' : ''}<span class="meta">${esc(t.responseTokens)} tok · ${esc(t.numToolCalls)} calls</span></li>`,
      )
      .join('') || '<div class="placeholder">none match</div>';
  if (!state.trajId || !d.items.some((t) => t.id === state.trajId)) state.trajId = d.items[0]?.id ?? null;
  const cur = document.querySelector(`#traj-list li[data-traj="${CSS.escape(state.trajId ?? '')}"]`);
  if (cur) cur.classList.add('sel');
  await loadTraj();
}

function maskBar(runs, total) {
  let x = 0;
  const rects = runs
    .map(([m, len]) => {
      const n = Number(len);
      const r = `<rect x="${esc(x)}" y="0" width="${esc(n)}" height="1" fill="${m ? 'var(--trained)' : 'var(--masked)'}"/>`;
      x += n;
      return r;
    })
    .join('');
  return `<svg class="maskbar" viewBox="0 0 ${esc(Math.max(1, total))} 1" preserveAspectRatio="none">${rects}</svg>`;
}

async function loadTraj() {
  const sel = state.sel;
  if (!sel || !state.trajId) {
    $('#traj-detail').innerHTML = '<div class="placeholder">select a trajectory</div>';
    return;
  }
  const id = state.trajId;
  const t = await api(
    `/api/trajectory?name=${encodeURIComponent(sel.name)}&kind=${sel.kind}&file=${encodeURIComponent(state.trajFile)}&id=${encodeURIComponent(id)}`,
  );
  if (state.sel !== sel || state.trajId !== id) return; // a newer selection renders its own
  const total = t.trainedTokens + t.maskedTokens;
  const head = `<div class="traj-head"><b>${esc(t.id)}</b>${verdict(t)}<span class="badge muted">${esc(t.finish)}</span>${t.reward != null ? `<span>reward ${fmt(t.reward)}</span>` : ''}${t.advantage != null ? `<span>advantage ${fmt(t.advantage)}</span>` : ''}${t.kept != null ? `<span>${t.kept ? 'kept by RoC' : 'dropped by RoC'}</span>` : ''}<span>${esc(t.numToolCalls)} tool calls, ${esc(t.numToolErrors)} errors</span><span>${fmt(t.ms / 1000, 1)} s</span></div>`;
  const mask = `${maskBar(t.maskRuns, total)}<div class="masklegend"><i class="sw" style="background:var(--trained)"></i>trained (mask 1): ${esc(t.trainedTokens)} tokens<i class="sw" style="background:var(--masked)"></i>masked tool observation (mask 0): ${esc(t.maskedTokens)} tokens</div>`;
  // the problem first: a trajectory record does not carry it, the server finds it in the run's pool or eval data
  const problem = `<div class="block problem"><label>Problem · ${esc(t.promptId)}</label><pre>${esc(t.problem ?? '(not found in the run or eval data)')}</pre></div>`;
  const turns = t.turns
    .map((u, i) => {
      const calls = u.toolCalls
        .map(
          (c) =>
            `<div class="block code"><label>Tool call · ${esc(c.name)}${c.parseError ? ` · parse error: ${esc(c.parseError)}` : ''}</label><pre>${esc(c.code)}</pre></div>`,
        )
        .join('');
      const results = u.toolResults
        .map(
          (r) =>
            `<div class="block result ${r.error ? 'err' : ''}"><label>Tool result · ${esc(r.status ?? (r.error ? 'error' : 'ok'))} · ${esc(r.ms)} ms · ${esc(r.tokens)} masked tokens</label><pre>${esc(r.text)}</pre></div>`,
        )
        .join('');
      const reasoning = u.reasoning
        ? `<div class="block reasoning"><label>Reasoning · ${esc(u.genTokens)} trained tokens</label><pre>${esc(u.reasoning)}</pre></div>`
        : '';
      // numbered from 1 in order: the agent loop counts its turns from 1, older records from 0
      return `<div class="turn" data-turn="${esc(u.turn)}"><div class="turn-h">Turn ${esc(i + 1)}${u.finishReason ? ` · finish: ${esc(u.finishReason)}` : ''}</div>${reasoning}${calls}${results}</div>`;
    })
    .join('');
  const answer = `<div class="block answer ${t.correct ? '' : 'wrong'}"><label>Answer</label><pre>${esc(t.answer ?? '(no <answer> block)')}</pre><div>extracted: <b>${esc(t.extracted ?? '–')}</b> · gold: <b>${esc(t.gold ?? '–')}</b></div></div>`;
  $('#traj-detail').innerHTML =
    head +
    mask +
    problem +
    turns +
    answer +
    (t.error ? `<div class="block result err"><label>Error</label><pre>${esc(t.error)}</pre></div>` : '');
}

// ---------- live updates ----------
async function poll() {
  try {
    const l = await api('/api/list');
    const key = JSON.stringify(l.entries);
    if (key !== JSON.stringify(state.list)) {
      state.list = l.entries;
      renderList();
      if (!state.sel && state.list.length)
        await select(state.list.find((e) => e.kind === 'run') || state.list[0]);
    }
    await refreshSelected();
    $('#live').textContent = `live · updated ${new Date().toLocaleTimeString()}`;
    $('#live').classList.remove('stale');
  } catch (e) {
    $('#live').textContent = `disconnected: ${e.message}`;
    $('#live').classList.add('stale');
  }
}

poll();
setInterval(poll, POLL_MS);
