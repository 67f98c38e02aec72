import assert from 'node:assert/strict';
import { appendFileSync, existsSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { type Browser, chromium, type Page } from 'playwright-core';
import { type Dashboard, startDashboard } from '../../src/dashboard/server.js';
import { fakeTrajectory } from '../../src/eval/fake.js';
import { appendJsonl } from '../../src/util/jsonl.js';
import { makeEval, metricLine } from './fixture.js';

// The dashboard as a newcomer's first run met it (issue 44), in headless Chromium: a series at 0, a negative
// axis, the trajectory view's problem and turn numbers, evals written beside runs/, a corrupt metrics line.

const CHROMIUM = process.env.RSTAR2_CHROMIUM ?? '/usr/bin/chromium';
const skip = existsSync(CHROMIUM) ? false : `chromium not found at ${CHROMIUM} (apt-get install chromium)`;

let root: string;
let dash: Dashboard;
let browser: Browser;
let page: Page;
const errors: string[] = [];

/** A run as `rstar2 train` writes it, `runs/first`: its tool-error ratio stays 0, its loss is negative. */
function makeRun(dir: string): void {
  mkdirSync(join(dir, 'trajectories'), { recursive: true });
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ name: 'first' }));
  appendJsonl(
    join(dir, 'metrics.jsonl'),
    Array.from({ length: 6 }, (_, i) => ({
      ...metricLine(i + 1),
      tool_error_ratio_pos: 0,
      loss: -1234567 - i * 1000,
    })),
  );
  writeFileSync(
    join(dir, 'pool-rl.json'),
    JSON.stringify(
      [0, 1].map((p) => ({ id: `q${p}`, question: `What is ${p} + 100?`, answer: String(100 + p) })),
    ),
  );
  // the agent loop numbers its turns from 1
  const rows = [0, 1].map((p) => {
    const t = fakeTrajectory({ problemId: `q${p}`, answer: String(100 + p), sample: 0, seed: p }, 1);
    return { ...t, events: t.events.map((e) => ({ ...e, turn: e.turn + 1 })), correct: true, reward: 1 };
  });
  appendJsonl(join(dir, 'trajectories', 'rl-step-000001.jsonl'), rows);
}

before(async () => {
  if (skip) return;
  root = mkdtempSync(join(tmpdir(), 'rstar2-dash-defects-'));
  makeRun(join(root, 'runs', 'first'));
  await makeEval(join(root, 'evals', 'aime-ckpt'), 0.5, 'fake:0.5');
  // `rstar2 dashboard --runs runs/`: the evals are beside it, in evals/
  dash = await startDashboard({
    root: join(root, 'runs'),
    more: [join(root, 'evals')],
    port: 0,
    pollMs: 300,
  });
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu'],
  });
  page = await browser.newPage({ viewport: { width: 1440, height: 1600 } });
  page.on('pageerror', (e) => errors.push(e.message));
});

after(async () => {
  await browser?.close();
  await dash?.close();
});

const plot = (id: string) => `charts.get(${JSON.stringify(id)})?.u`;

test('a series that stays at 0 spans 0..100 %, and a negative axis keeps its minus sign', {
  skip,
  timeout: 60_000,
}, async () => {
  await page.goto(dash.url);
  await page.waitForFunction(
    `${plot('tool_error')}?.data[0].length === 6 && ${plot('loss')}?.data[0].length === 6`,
  );
  // uPlot's band for all zeros made it -100 %..100 %
  assert.deepEqual(
    await page.evaluate(`[${plot('tool_error')}.scales.y.min, ${plot('tool_error')}.scales.y.max]`),
    [0, 1],
  );
  const labels = (await page.evaluate(`${plot('tool_error')}.axes[1]._values`)) as string[];
  assert.ok(
    labels.every((l) => !l.startsWith('-')),
    labels.join(' '),
  );
  // every label fits the axis: a fixed 50 px cut the sign off "-1,236,000"
  const fit = (await page.evaluate(`(() => {
    const u = ${plot('loss')}, a = u.axes[1];
    u.ctx.font = a.font[0];
    const widest = Math.max(...a._values.map((v) => u.ctx.measureText(v).width)) / uPlot.pxRatio;
    return { widest, room: a._size - a.ticks.size - a.gap, labels: a._values };
  })()`)) as { widest: number; room: number; labels: string[] };
  assert.ok(
    fit.labels.some((l) => l.startsWith('-')),
    fit.labels.join(' '),
  );
  assert.ok(fit.widest <= fit.room, `labels ${fit.widest.toFixed(1)} px wide, room for ${fit.room} px`);
  assert.deepEqual(errors, []);
});

test('the trajectory view shows the problem and numbers the first turn 1', {
  skip,
  timeout: 60_000,
}, async () => {
  await page.goto(dash.url);
  await page.waitForSelector('#traj-detail .turn');
  const problem = await page.textContent('#traj-detail .block.problem');
  assert.match(problem ?? '', /Problem · q0\s*What is 0 \+ 100\?/);
  const heads = await page.$$eval('#traj-detail .turn-h', (els) => els.map((e) => e.textContent ?? ''));
  assert.deepEqual(
    heads.map((h) => h.split(' ·')[0]),
    ['Turn 1', 'Turn 2'],
  );
  assert.deepEqual(errors, []);
});

test('--runs runs/ lists the evals that rstar2 eval wrote to evals/ beside it', {
  skip,
  timeout: 60_000,
}, async () => {
  await page.goto(dash.url);
  await page.waitForSelector('#evals li.entry');
  assert.deepEqual(
    await page.$$eval('#evals li.entry', (els) => els.map((e) => e.getAttribute('data-name'))),
    ['evals/aime-ckpt'],
  );
  await page.click('#evals li.entry');
  await page.waitForSelector('#eval-card:not(.hidden) #eval-stats .stat');
  assert.match((await page.textContent('#eval-title')) ?? '', /evals\/aime-ckpt/);
});

test('one corrupt line in a metrics.jsonl costs that record, not the run list', {
  skip,
  timeout: 60_000,
}, async () => {
  const bad = join(root, 'runs', 'bad');
  makeRun(bad);
  appendFileSync(join(bad, 'metrics.jsonl'), '{"stage": "rl", "step": 7, "reward_mean": 0.\n');
  appendJsonl(join(bad, 'metrics.jsonl'), [metricLine(8)]);
  const list = await fetch(new URL('/api/list', dash.url));
  assert.equal(list.status, 200, await list.clone().text());
  await page.goto(dash.url);
  await page.waitForSelector('#runs li.entry[data-name="bad"]');
  await page.click('#runs li.entry[data-name="bad"]');
  await page.waitForFunction(`/7 steps/.test(document.querySelector('#run-title')?.textContent ?? '')`);
  assert.match(
    (await page.textContent('#run-title')) ?? '',
    /1 unreadable line\(s\) left out: metrics\.jsonl:7/,
  );
  assert.deepEqual(errors, []);
});
