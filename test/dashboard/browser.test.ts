import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, beforeEach, test } from 'node:test';
import { type Browser, chromium, type Page } from 'playwright-core';
import { type Dashboard, startDashboard } from '../../src/dashboard/server.js';
import { fakeTrajectory } from '../../src/eval/fake.js';
import { appendJsonl } from '../../src/util/jsonl.js';
import { makeEval, makeRun, metricLine } from './fixture.js';

// Real headless Chromium over a real-shaped run directory. Skips (with a message) only where Debian's
// chromium is not installed.
const CHROMIUM = process.env.RSTAR2_CHROMIUM ?? '/usr/bin/chromium';
const skip = existsSync(CHROMIUM) ? false : `chromium not found at ${CHROMIUM} (apt-get install chromium)`;
const SHOTS = process.env.RSTAR2_SCREENSHOT_DIR ?? join(tmpdir(), 'rstar2-dashboard-screenshots');

let root: string;
let dash: Dashboard;
let browser: Browser;
let page: Page;

before(async () => {
  if (skip) return;
  root = mkdtempSync(join(tmpdir(), 'rstar2-dash-'));
  makeRun(join(root, 'runs', 'demo'), 24);
  await makeEval(join(root, 'evals', 'ckpt-a'), 0.4, 'fake:0.4');
  await makeEval(join(root, 'evals', 'ckpt-b'), 0.8, 'fake:0.8');
  dash = await startDashboard({ root, port: 0, pollMs: 300 });
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  page = await browser.newPage({ viewport: { width: 1440, height: 1800 } });
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(m.text());
  });
  (page as unknown as { jsErrors: string[] }).jsErrors = errors;
});

after(async () => {
  await browser?.close();
  await dash?.close();
});

const jsErrors = () => (page as unknown as { jsErrors: string[] }).jsErrors;
// each test answers for the errors of its own page visits, so one failure does not fail the tests after it
beforeEach(() => {
  if (page) jsErrors().length = 0;
});

// The page's chart registry (a global of app.js): id → {u: the uPlot instance, …}. Optional chaining: a chart
// is made once the page's data has arrived, which may be after `goto`, and a waitForFunction predicate that
// throws fails at once instead of being retried.
const plot = (id: string) => `charts.get(${JSON.stringify(id)})?.u`;
const legend = (page: Page, id: string, part: 'label' | 'value') =>
  page.$$eval(`[data-chart="${id}"] .u-legend tr.u-series .u-${part}`, (els) =>
    els.map((e) => e.textContent ?? ''),
  );

test('dashboard renders training curves, RoC table and a trajectory', { skip, timeout: 90_000 }, async () => {
  await page.goto(dash.url);
  await page.waitForSelector('#charts [data-chart="reward"] .uplot canvas');
  const charts = await page.$$eval('#charts .chart', (els) => els.map((e) => e.getAttribute('data-chart')));
  for (const c of ['reward', 'accuracy', 'tool_error', 'length', 'time', 'roc', 'roc_groups']) {
    assert.ok(charts.includes(c), `chart ${c} missing (have ${charts.join(', ')})`);
  }
  assert.equal(await page.locator('#charts .chart .uplot canvas').count(), charts.length);
  assert.deepEqual(await page.evaluate(`${plot('reward')}.data[1].filter((v) => v != null).length`), 24);
  assert.deepEqual(await legend(page, 'accuracy', 'label'), ['step', 'train accuracy', 'held-out']);
  assert.equal(await page.evaluate(`${plot('accuracy')}.data[2].filter((v) => v != null).length`), 2);
  assert.deepEqual(await legend(page, 'time', 'label'), ['step', 'rollout', 'reward', 'update']);
  assert.equal(await page.evaluate(`${plot('time')}.bands.length`), 2); // stacked rollout/reward/update
  assert.equal(await page.locator('#roc tbody tr').count(), 24);

  // trajectory viewer: the newest step file, first trajectory, with every turn part
  await page.waitForSelector('#traj-detail .turn');
  assert.equal(
    await page.$eval('#traj-file', (e) => (e as unknown as { value: string }).value),
    'trajectories/rl-step-000020.jsonl',
  );
  const detail = await page.textContent('#traj-detail');
  assert.match(detail ?? '', /Reasoning/);
  assert.match(detail ?? '', /Tool call · execute_python_code_with_standard_io/);
  assert.match(detail ?? '', /Tool result/);
  assert.match(detail ?? '', /Answer/);
  assert.match(detail ?? '', /masked tool observation \(mask 0\): 30 tokens/);
  assert.equal(await page.locator('#traj-detail .maskbar rect').count(), 3);

  // filters
  await page.click('[data-filter="tool_error"]');
  await page.waitForSelector('[data-filter="tool_error"].on');
  const listed = await page.locator('#traj-list li[data-traj]').count();
  const label = await page.textContent('[data-filter="tool_error"]');
  assert.equal(`tool error (${listed})`, label);
  assert.ok(listed > 0);
  await page.waitForSelector('#traj-detail .block.result.err');
  await page.click('[data-filter="correct"]');
  await page.waitForSelector('[data-filter="correct"].on');
  // every listed trajectory carries the 'correct' badge (a string: the test's tsconfig has no DOM types)
  await page.waitForFunction(
    "[...document.querySelectorAll('#traj-list li[data-traj]')].every((li) => li.querySelector('.badge.ok'))",
  );
  await page.click('[data-filter="all"]');
  await page.waitForSelector('[data-filter="all"].on');
  mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: join(SHOTS, 'run.png'), fullPage: true });
  console.log(`screenshot: ${join(SHOTS, 'run.png')}`);
  assert.deepEqual(jsErrors(), []);
});

test('charts: hover shows every series in the legend, across panels; legend toggles; drag zooms', {
  skip,
  timeout: 60_000,
}, async () => {
  await page.goto(dash.url);
  await page.waitForSelector('[data-chart="reward"] .uplot canvas');
  const over = page.locator('[data-chart="reward"] .u-over');
  const box = await over.boundingBox();
  assert.ok(box);
  await over.hover({ position: { x: box.width / 2, y: box.height / 2 } });
  await page.waitForFunction(
    `(document.querySelector('[data-chart="reward"] .u-legend tr.u-series .u-value')?.textContent ?? '–') !== '–'`,
  );
  const [stepText, reward] = await legend(page, 'reward', 'value');
  const step = Number(stepText);
  assert.ok(step > 1 && step < 24, stepText);
  assert.ok(Math.abs(Number(reward) - metricLine(step).reward_mean) < 1e-3, `${reward} at step ${step}`);
  // the cursor follows on the other panels: same step, each series' own value (not the stacked sum)
  const [accStep, acc] = await legend(page, 'accuracy', 'value');
  assert.equal(accStep, stepText);
  assert.equal(acc, `${(100 * metricLine(step).accuracy).toFixed(1)}%`);
  const time = await legend(page, 'time', 'value');
  assert.deepEqual(time.slice(1).map(Number), [metricLine(step).time_rollout_s, 2, 12]);

  // a legend click hides a series; a stacked chart restacks the rest
  const rollout = page.locator('[data-chart="time"] .u-legend tr.u-series').nth(1);
  assert.equal(await page.evaluate(`${plot('time')}.data[2][0]`), 31 + 2);
  await rollout.click();
  assert.equal(await page.evaluate(`${plot('time')}.series[1].show`), false);
  assert.match((await rollout.getAttribute('class')) ?? '', /u-off/);
  assert.equal(await page.evaluate(`${plot('time')}.data[2][0]`), 2);
  await rollout.click();
  assert.equal(await page.evaluate(`${plot('time')}.data[2][0]`), 31 + 2);

  // drag to zoom (every panel follows), double-click to reset
  const scaleX = (id: string) => page.evaluate(`[${plot(id)}.scales.x.min, ${plot(id)}.scales.x.max]`);
  assert.deepEqual(await scaleX('reward'), [1, 24]);
  const y = box.y + box.height / 2;
  await page.mouse.move(box.x + box.width * 0.25, y);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width * 0.6, y, { steps: 5 });
  await page.mouse.up();
  const [lo, hi] = (await scaleX('reward')) as number[];
  assert.ok(lo > 4 && hi < 16 && lo < hi, `zoomed to ${lo}..${hi}`);
  assert.deepEqual(await scaleX('accuracy'), [lo, hi]);
  await page.mouse.dblclick(box.x + box.width / 2, y);
  assert.deepEqual(await scaleX('reward'), [1, 24]);
  assert.deepEqual(await scaleX('accuracy'), [1, 24]);
  assert.deepEqual(jsErrors(), []);
});

test('dashboard updates live as training appends metrics', { skip, timeout: 60_000 }, async () => {
  await page.goto(dash.url);
  await page.waitForFunction(`${plot('reward')}.data[0].length === 24`);
  // zoomed in, the new points arrive through setData and the zoom stays
  const box = await page.locator('[data-chart="reward"] .u-over').boundingBox();
  assert.ok(box);
  await page.mouse.move(box.x + box.width * 0.2, box.y + 20);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width * 0.5, box.y + 20, { steps: 5 });
  await page.mouse.up();
  const zoomed = await page.evaluate(`${plot('reward')}.scales.x.max`);
  await page.evaluate(`window.__reward = ${plot('reward')}`);
  appendJsonl(join(root, 'runs', 'demo', 'metrics.jsonl'), [metricLine(25), metricLine(26)]);
  await page.waitForFunction(`${plot('reward')}.data[0].length === 26`, undefined, { timeout: 20_000 });
  assert.match((await page.textContent('#run-title')) ?? '', /26 steps/);
  assert.equal(await page.evaluate(`${plot('reward')}.scales.x.max`), zoomed);
  assert.equal(await page.evaluate(`${plot('reward')} === window.__reward`), true, 'same chart, new data');
  await page.mouse.dblclick(box.x + box.width / 2, box.y + 20);
  assert.equal(await page.evaluate(`${plot('reward')}.scales.x.max`), 26);
});

test('dashboard shows the trainer health warnings, as text', { skip, timeout: 60_000 }, async () => {
  await page.goto(dash.url);
  await page.waitForSelector('[data-chart="reward"] .uplot canvas');
  assert.equal(await page.locator('#run-health.hidden').count(), 1);
  const hostile = '<img src=x onerror="window.__pwned=1">';
  appendJsonl(join(root, 'runs', 'demo', 'metrics.jsonl'), [
    { ...metricLine(27), health: [{ code: 'zero_reward', message: `rl step 27: reward 0 ${hostile}` }] },
  ]);
  await page.waitForSelector('#run-health li', { timeout: 20_000 });
  const text = (await page.textContent('#run-health')) ?? '';
  assert.match(text, /zero_reward/);
  assert.ok(text.includes(hostile), 'the message is shown as text');
  assert.equal(await page.locator('#run-health img').count(), 0);
  assert.equal(await page.evaluate('window.__pwned'), undefined);
});

test('dashboard shows eval reports side by side', { skip, timeout: 60_000 }, async () => {
  await page.goto(dash.url);
  await page.click('li.entry[data-name="evals/ckpt-a"]');
  await page.click('input[data-compare="evals/ckpt-b"]');
  await page.waitForSelector('#compare-table th:nth-child(3)');
  const heads = await page.$$eval('#compare-table thead th', (els) => els.map((e) => e.textContent));
  assert.deepEqual(heads.slice(1).sort(), ['evals/ckpt-a', 'evals/ckpt-b']);
  const rows = await page.$$eval('#compare-table tbody tr', (els) => els.map((e) => e.textContent ?? ''));
  assert.ok(rows.some((r) => r.startsWith('avg@k (mean pass@1)')));
  assert.ok((await page.locator('#compare-table td.best').count()) > 0);
  assert.equal(await page.locator('#eval-problems tbody tr').count(), 5);
  await page.waitForSelector('#traj-detail .turn');
  await page.screenshot({ path: join(SHOTS, 'evals.png'), fullPage: true });
  assert.deepEqual(jsErrors(), []);
});

test('dashboard over a run written by `rstar2 train` (fake policy): stages, curves, tool calls', {
  skip,
  timeout: 120_000,
}, async () => {
  const root2 = mkdtempSync(join(tmpdir(), 'rstar2-dash-train-'));
  const r = spawnSync(
    process.execPath,
    [
      'bin/rstar2.js',
      'train',
      '--recipe',
      'quickstart',
      '--policy-backend',
      'fake',
      '--out',
      join(root2, 'qs'),
    ],
    { encoding: 'utf8', env: { ...process.env, RSTAR2_NO_PROGRESS: '1' } },
  );
  assert.equal(r.status, 0, r.stderr);
  const d2 = await startDashboard({ root: root2, port: 0, pollMs: 500 });
  try {
    await page.goto(d2.url);
    await page.waitForSelector('#charts [data-chart="reward"] .uplot canvas');
    const stages = await page.$$eval('#stage-tabs button', (els) => els.map((e) => e.textContent ?? ''));
    assert.ok(
      stages.some((s) => s.startsWith('sft')) && stages.some((s) => s.startsWith('rl')),
      stages.join(),
    );
    assert.ok((await page.locator('#roc tbody tr').count()) > 0);
    await page.click('[data-filter="tool_error"]');
    await page.waitForSelector('#traj-detail .block.result.err');
    const code = await page.textContent('#traj-detail .block.code pre');
    assert.ok(code && code !== '{}' && code.length > 3, `tool code shown: ${code}`);
    await page.click('#stage-tabs button:first-child');
    await page.waitForSelector('#charts [data-chart="loss"]');
    await page.screenshot({ path: join(SHOTS, 'train-run.png'), fullPage: true });
    assert.deepEqual(jsErrors(), []);
  } finally {
    await page.goto('about:blank'); // a page left open keeps polling a closed server: connection-refused errors
    await d2.close();
  }
});

test('numbers from a tampered run directory render as text, never as markup (dashboard with a token)', {
  skip,
  timeout: 120_000,
}, async () => {
  const hostile = '<img src=x onerror="window.__pwned=1">';
  const root3 = mkdtempSync(join(tmpdir(), 'rstar2-dash-xss-'));
  const run = join(root3, 'runs', 'evil');
  mkdirSync(join(run, 'trajectories'), { recursive: true });
  appendJsonl(join(run, 'metrics.jsonl'), [metricLine(1)]);
  const t = fakeTrajectory({ problemId: 'q0', answer: '42', sample: 0, seed: 1 }, 1);
  appendJsonl(join(run, 'trajectories', 'rl-step-000001.jsonl'), [
    {
      ...t,
      numToolCalls: hostile,
      numToolErrors: hostile,
      events: t.events.map((e) => ({
        ...e,
        turn: hostile,
        ...(e.kind === 'tool_result' ? { ms: hostile } : {}),
      })),
    },
  ]);
  const ev = join(root3, 'evals', 'evil');
  await makeEval(ev, 0.5, 'fake:0.5');
  const report = JSON.parse(readFileSync(join(ev, 'report.json'), 'utf8'));
  report.perProblem = report.perProblem.map((p: object) => ({
    ...p,
    correct: hostile,
    n: hostile,
    majorityVotes: hostile,
  }));
  writeFileSync(join(ev, 'report.json'), JSON.stringify(report));
  const d3 = await startDashboard({ root: root3, port: 0, pollMs: 500, token: 'browser-token-0123456789' });
  await page.goto('about:blank');
  const errorsBefore = jsErrors().length;
  try {
    await page.goto(d3.url); // carries ?token=; the page passes it on to every API call
    await page.click('li.entry[data-name="runs/evil"]', { timeout: 60_000 });
    await page.waitForSelector('#traj-detail .turn', { timeout: 60_000 });
    const list = (await page.textContent('#traj-list')) ?? '';
    assert.ok(list.includes(`${hostile} calls`), list);
    const detail = (await page.textContent('#traj-detail')) ?? '';
    assert.ok(detail.includes(`${hostile} tool calls, ${hostile} errors`), detail);
    assert.ok(detail.includes(`· ${hostile} ms ·`), 'tool-result ms as text');
    assert.ok(detail.includes('Turn 1'), 'turns are numbered by position, not by the record');
    assert.equal(await page.getAttribute('#traj-detail .turn', 'data-turn'), hostile);
    await page.click('li.entry[data-name="evals/evil"]');
    await page.waitForSelector('#eval-problems tbody tr', { timeout: 60_000 });
    const problems = (await page.textContent('#eval-problems')) ?? '';
    assert.ok(problems.includes(`${hostile}/${hostile}`), problems);
    assert.ok(problems.includes(`(${hostile})`), problems);
    await page.waitForTimeout(500); // an injected <img> fails to load at once; give onerror its turn
    assert.equal(await page.locator('img').count(), 0);
    assert.equal(await page.evaluate('window.__pwned'), undefined);
    assert.deepEqual(jsErrors().slice(errorsBefore), []);
  } finally {
    await page.goto('about:blank');
    await d3.close();
  }
});
