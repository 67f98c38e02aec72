import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { Trajectory } from '../../src/rl/trajectory.js';

const sim = (...args: string[]) =>
  spawnSync(
    process.execPath,
    ['--import', 'tsx', 'bench/scheduler-sim.ts', '--regime', 'TP1-80GB', '--seeds', '1', ...args],
    {
      encoding: 'utf8',
    },
  );

/** A recorded trajectory: `gens` generated tokens per turn, each turn but the last followed by a 50-token tool result. */
function record(promptId: string, sample: number, gens: number[], finish: Trajectory['finish'] = 'answered') {
  const events: Trajectory['events'] = [];
  let at = 0;
  gens.forEach((g, turn) => {
    events.push({ kind: 'generation', turn, start: at, end: at + g, finishReason: 'stop', ms: 10 });
    at += g;
    if (turn < gens.length - 1) {
      events.push({ kind: 'tool_result', turn, text: '', error: false, ms: 300, start: at, end: at + 50 });
      at += 50;
    }
  });
  return { id: `${promptId}#${sample}`, promptId, sample, promptIds: new Array(400).fill(1), events, finish };
}

test('scheduler-sim --replay runs recorded lengths: groups, turns, budget and prompt share from the file', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-replay-'));
  try {
    mkdirSync(join(dir, 'trajectories'));
    const lines = [];
    // two prompts far apart in length, samples of each close together: nearly all the variance is the prompt's
    for (let i = 0; i < 16; i++) lines.push(record('short', i, [100 + i, 100]));
    for (let i = 0; i < 16; i++)
      lines.push(record('long', i, [2000 + 10 * i, 1000, 1000, 1000, 1000, 1000, 900]));
    lines.push(record('long', 16, [5], 'error'));
    writeFileSync(
      join(dir, 'trajectories', 'rl-step-000001.jsonl'),
      lines.map((l) => JSON.stringify(l)).join('\n'),
    );
    const r = sim('--replay', dir);
    assert.equal(r.status, 0, r.stderr);
    assert.match(
      r.stdout,
      /lengths replayed from 32 trajectories of 2 prompts in 1 file\(s\) \(1 with an engine error left out\)/,
    );
    // the longest: 2150 + 5900 generated and 6 tool results of 50 (seven turns)
    assert.match(r.stdout, /budget 8350;/);
    const share = Number(/rollout\.prompt_share would read it ([\d.]+)/.exec(r.stdout)?.[1]);
    assert.ok(share > 0.95, `prompt share ${share}`);
    assert.match(r.stdout, /^kv-predict +[\d.]+ /m);

    // a budget below the longest cuts those responses there
    const cut = sim('--replay', dir, '--budget', '4096');
    assert.equal(cut.status, 0, cut.stderr);
    assert.match(cut.stdout, /budget 4096;/);

    writeFileSync(join(dir, 'metrics.jsonl'), `${JSON.stringify({ step: 1, loss: 0.5 })}\n`);
    const bad = sim('--replay', join(dir, 'metrics.jsonl'));
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr, /metrics\.jsonl:1 is not a trajectory record/);
    const none = sim('--replay', join(dir, 'nowhere'));
    assert.match(none.stderr, /--replay: .*nowhere does not exist/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
