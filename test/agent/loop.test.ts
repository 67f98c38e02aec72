import assert from 'node:assert/strict';
import { test } from 'node:test';
import { BatchingRunner } from '../../src/agent/batching.js';
import { type AgentOptions, runRollouts, runTrajectory, streamRollouts } from '../../src/agent/loop.js';
import { FakeEngine, type FakeReply } from '../../src/engines/fake.js';
import { type RolloutStats, Scheduler } from '../../src/engines/scheduler.js';
import type { Trajectory } from '../../src/rl/trajectory.js';
import { CALL, decode, encode, FakeRunner, IM_END, template } from './helpers.js';

/** An engine that plays `script[k]` where k = tool responses seen so far in the input. */
function scripted(script: (string | ((k: number) => FakeReply))[], name = 'fake', capacityTokens = 1 << 20) {
  return new FakeEngine(
    (ids) => {
      const k = decode(ids).split('<tool_response>').length - 1;
      const s = script[Math.min(k, script.length - 1)];
      if (typeof s === 'function') return s(k);
      const out = encode(s);
      return { outputIds: out, logprobs: out.map((_, i) => -0.01 * (i + 1)) };
    },
    { name, capacityTokens },
  );
}

async function one(engine: FakeEngine, opts: Partial<AgentOptions> = {}, runner = new FakeRunner()) {
  const sched = await Scheduler.create([engine], { pollMs: 0 });
  const t = await runTrajectory({ id: 'p1', question: 'What is 1+1?' }, 0, sched, {
    template,
    runner,
    ...opts,
  });
  assert.equal(sched.ledger.reserved[0], 0, 'reservation released');
  await sched.close();
  return { t, runner };
}

function checkAligned(t: Trajectory) {
  assert.equal(t.responseMask.length, t.responseIds.length);
  assert.equal(t.responseLogprobs.length, t.responseIds.length);
  t.responseMask.forEach((m, i) => {
    if (m === 0) assert.equal(t.responseLogprobs[i], 0);
  });
  assert.equal(t.responseMask.at(-1), 1, 'never ends on a tool turn');
  assert.doesNotThrow(() => JSON.parse(JSON.stringify(t)));
}

test('two tool turns then an answer: exact ids, masks, logprobs and the reference turn boundary', async () => {
  const turn1 = `Let me compute.${CALL}<|im_end|>`;
  const final = 'So it is \\boxed{2}</reason> <answer>\\boxed{2}</answer><|im_end|>';
  const { t, runner } = await one(scripted([turn1, turn1, final]));
  checkAligned(t);
  assert.equal(t.finish, 'answered');
  assert.equal(t.numToolCalls, 2);
  assert.equal(t.numToolErrors, 0);
  assert.equal(runner.requests.length, 2);
  assert.equal(runner.requests[0].stdin, undefined);
  assert.match(runner.requests[0].code, /_rstar2_cell|print/);
  assert.deepEqual(t.promptIds, template.promptIds('What is 1+1?'));
  // generated turn 1, then the tool turn directly after <|im_end|> (no '\n'): rStar2's boundary
  const g1 = encode(turn1);
  assert.deepEqual(t.responseIds.slice(0, g1.length), g1);
  assert.deepEqual(t.responseLogprobs.slice(0, 3), [-0.01, -0.02, -0.03]);
  const toolText = t.events.find((e) => e.kind === 'tool_result');
  assert.ok(toolText && toolText.kind === 'tool_result');
  assert.match(toolText.text, /^Tool call success\nstdout: 2\n/);
  const tool1 = template.toolTurnIds([toolText.text]);
  assert.deepEqual(t.responseIds.slice(g1.length, g1.length + tool1.length), tool1);
  assert.deepEqual(
    t.responseMask.slice(g1.length, g1.length + tool1.length),
    tool1.map(() => 0),
  );
  assert.equal(toolText.start, g1.length);
  assert.equal(toolText.end, g1.length + tool1.length);
  assert.equal(t.text, decode(t.responseIds));
  assert.ok(t.text.endsWith(final));
  assert.equal(t.events.filter((e) => e.kind === 'generation').length, 3);
  const ones = t.responseMask.filter((m) => m === 1).length;
  assert.equal(ones, 2 * g1.length + encode(final).length);
});

test("turnBoundary 'rerender' inserts the separator after <|im_end|> with mask 0", async () => {
  const turn1 = `x${CALL}<|im_end|>`;
  const { t } = await one(scripted([turn1, 'done<|im_end|>']), { turnBoundary: 'rerender' });
  const g = encode(turn1).length;
  assert.equal(t.responseIds[g - 1], IM_END);
  assert.equal(decode([t.responseIds[g]]), '\n');
  assert.equal(t.responseMask[g], 0);
  assert.equal(t.finish, 'answered');
});

test('a malformed call becomes "Failed to decode tool call" and never reaches the sandbox', async () => {
  const bad = '<tool_call>{"name": "python_code_with_standard_io", "arguments": {oops}</tool_call><|im_end|>';
  const { t, runner } = await one(scripted([bad, 'ok<|im_end|>']));
  assert.equal(runner.requests.length, 0);
  assert.equal(t.numToolCalls, 1);
  assert.equal(t.numToolErrors, 1);
  const r = t.events.find((e) => e.kind === 'tool_result');
  assert.ok(r && r.kind === 'tool_result' && r.text.startsWith('Failed to decode tool call: '));
  const c = t.events.find((e) => e.kind === 'tool_call');
  assert.ok(c && c.kind === 'tool_call' && c.parseError);
  assert.match(t.text, /<tool_response>\nFailed to decode tool call: /);
});

test('only the first call per turn runs; a malformed first call shadows a valid second one', async () => {
  const two = `${CALL}${CALL.replace('1+1', '2+2')}<|im_end|>`;
  const r1 = await one(scripted([two, 'a<|im_end|>']));
  assert.equal(r1.runner.requests.length, 1);
  assert.equal(r1.t.numToolCalls, 1);
  const shadow = `<tool_call>not json</tool_call>${CALL}<|im_end|>`;
  const r2 = await one(scripted([shadow, 'a<|im_end|>']));
  assert.equal(r2.runner.requests.length, 0);
  const inner = new FakeRunner();
  const r3 = await one(scripted([two, 'a<|im_end|>']), {
    maxParallelCalls: 2,
    runner: new BatchingRunner(inner),
  });
  assert.equal(inner.requests.length, 2);
  assert.equal(r3.t.numToolCalls, 2);
  assert.deepEqual(inner.batchSizes, [2], 'calls of one turn go out together');
});

test('unknown tool and non-object arguments become error responses', async () => {
  const unknown = '<tool_call>{"name": "WolframAlpha", "arguments": {"q": 1}}</tool_call><|im_end|>';
  const { t, runner } = await one(scripted([unknown, 'a<|im_end|>']));
  assert.equal(runner.requests.length, 0);
  const r = t.events.find((e) => e.kind === 'tool_result');
  assert.ok(r && r.kind === 'tool_result');
  assert.equal(r.text, "Error when executing tool: 'WolframAlpha'");
  assert.equal(t.numToolErrors, 1);
  const strArgs =
    '<tool_call>{"name": "python_code_with_standard_io", "arguments": "print(1)"}</tool_call><|im_end|>';
  const r2 = await one(scripted([strArgs, 'a<|im_end|>']));
  assert.equal(r2.runner.requests.length, 0);
  assert.equal(r2.t.numToolErrors, 1);
});

test('max assistant turns: 5 generations, 4 tool executions, finish max_turns', async () => {
  const { t, runner } = await one(scripted([`${CALL}<|im_end|>`]));
  assert.equal(t.finish, 'max_turns');
  assert.equal(t.events.filter((e) => e.kind === 'generation').length, 5);
  assert.equal(runner.requests.length, 4);
  checkAligned(t);
  const r3 = await one(scripted([`${CALL}<|im_end|>`]), { maxTurns: 2 });
  assert.equal(r3.runner.requests.length, 1);
});

test('response budget counts tool tokens; a tool turn that would overflow ends the trajectory', async () => {
  const turn = `${CALL}<|im_end|>`;
  const g = encode(turn).length;
  const engine = scripted([turn]);
  const seen: number[] = [];
  const spy = new FakeEngine((ids, s, c) => {
    seen.push(s.maxNewTokens);
    return (engine as unknown as { respond: (i: number[], s: unknown, c: number) => FakeReply }).respond(
      ids,
      s,
      c,
    );
  });
  const { t } = await one(spy, { maxResponseTokens: g + 10 });
  assert.equal(t.finish, 'tool_overflow');
  assert.equal(t.responseIds.length, g, 'tool ids not appended');
  assert.deepEqual(seen, [g + 10]);
  checkAligned(t);
  // a budget that runs out mid-generation: finish length, exactly budget ids
  const { t: t2 } = await one(scripted(['y'.repeat(500)]), { maxResponseTokens: 100 });
  assert.equal(t2.finish, 'length');
  assert.equal(t2.responseIds.length, 100);
  // second turn gets only what is left
  const seen2: number[] = [];
  const long = `${'z'.repeat(50)}${CALL}<|im_end|>`;
  const e2 = scripted([long, 'w'.repeat(1000)]);
  const spy2 = new FakeEngine((ids, s, c) => {
    seen2.push(s.maxNewTokens);
    return (e2 as unknown as { respond: (i: number[], s: unknown, c: number) => FakeReply }).respond(
      ids,
      s,
      c,
    );
  });
  const { t: t3 } = await one(spy2, { maxResponseTokens: 1000 });
  assert.equal(t3.finish, 'length');
  assert.equal(t3.responseIds.length, 1000);
  assert.equal(seen2[1], 1000 - (t3.events.find((e) => e.kind === 'tool_result') as { end: number }).end);
});

test('engine errors are retried per turn, then reported; never lost', async () => {
  let n = 0;
  const flaky = new FakeEngine(() => {
    n++;
    return n === 1
      ? { outputIds: [], finishReason: 'error', error: 'HTTP 503' }
      : { outputIds: encode('hi<|im_end|>') };
  });
  const { t } = await one(flaky);
  assert.equal(t.finish, 'answered');
  assert.ok(t.events.some((e) => e.kind === 'error' && e.message.includes('503')));
  const dead = new FakeEngine(() => ({ outputIds: [], finishReason: 'error', error: 'connection refused' }));
  const { t: t2 } = await one(dead, { maxAttempts: 2 });
  assert.equal(t2.finish, 'error');
  assert.match(t2.error ?? '', /connection refused/);
  assert.equal(dead.calls, 2);
});

test('a server-side abort keeps the partial output and resumes from it', async () => {
  let n = 0;
  const e = new FakeEngine(() => {
    n++;
    if (n === 1) return { outputIds: encode('par'), finishReason: 'abort', error: 'pause for weight sync' };
    return { outputIds: encode('tial<|im_end|>') };
  });
  const { t } = await one(e);
  assert.equal(t.finish, 'answered');
  assert.equal(t.text, 'partial<|im_end|>');
  assert.ok(t.responseMask.every((m) => m === 1));
  const gens = t.events.filter((x) => x.kind === 'generation');
  assert.equal(gens.length, 1);
});

test('a crashed sandbox batch becomes an error tool response, the trajectory continues', async () => {
  const runner = new BatchingRunner(new FakeRunner(undefined, 0, true));
  const { t } = await one(
    scripted([`${CALL}<|im_end|>`, 'fine<|im_end|>']),
    {},
    runner as unknown as FakeRunner,
  );
  assert.equal(t.finish, 'answered');
  assert.equal(t.numToolErrors, 1);
  const r = t.events.find((e) => e.kind === 'tool_result');
  assert.ok(r && r.kind === 'tool_result' && /Tool call failure/.test(r.text));
});

test('runRollouts: n samples per problem, sticky engines, progress, all reservations released', async () => {
  const engines = [0, 1, 2].map((i) =>
    scripted([`${CALL}<|im_end|>`, `\\boxed{${i}}<|im_end|>`], `e${i}`, 20_000),
  );
  const sched = await Scheduler.create(engines, { pollMs: 0, policy: 'kv-budget' });
  const runner = new BatchingRunner(new FakeRunner());
  let progress = 0;
  const problems = Array.from({ length: 7 }, (_, i) => ({
    id: `q${i}`,
    question: `problem ${i}`,
    gold: String(i),
  }));
  const ts = await runRollouts({
    scheduler: sched,
    template,
    runner,
    problems,
    n: 4,
    maxResponseTokens: 4000,
    onProgress: (d, total) => {
      progress = d;
      assert.equal(total, 28);
    },
  });
  assert.equal(ts.length, 28);
  assert.equal(progress, 28);
  assert.deepEqual(
    ts.map((t) => t.id),
    problems.flatMap((p) => [0, 1, 2, 3].map((s) => `${p.id}#${s}`)),
  );
  for (const t of ts) {
    assert.equal(t.finish, 'answered');
    // the final answer names the engine that produced it, so both turns ran on the lease's engine
    assert.ok(t.text.endsWith(`\\boxed{${t.engine?.slice(1)}}<|im_end|>`));
    checkAligned(t);
  }
  assert.deepEqual(sched.ledger.reserved, [0, 0, 0]);
  // capacity 20k / budget ~4.03k: at most 4 trajectories per engine at once
  for (const p of sched.ledger.peakReserved) assert.ok(p <= 20_000);
  assert.ok(runner.batches < 56, `tool calls were batched (${runner.batches} batches for 28 calls)`);
  await sched.close();
});

test('a rollout seed is one per sample (the same seed n times would draw one answer n times), stable, not shared', async () => {
  const seen = new Map<string, number>(); // `${question}#${seed}` -> how often
  const e = new FakeEngine((ids, s) => {
    const key = `${decode(ids)}#${s.seed}`;
    seen.set(key, (seen.get(key) ?? 0) + 1);
    return { outputIds: encode(`\\boxed{1}${IM_END}`) };
  });
  const problems = [0, 1].map((i) => ({ id: `q${i}`, question: `problem ${i}` }));
  const run = async (seed: number, ps = problems) => {
    seen.clear();
    await runRollouts({
      engines: [e],
      schedulerOptions: { pollMs: 0 },
      template,
      runner: new FakeRunner(),
      problems: ps,
      n: 3,
      sampling: { seed },
    });
    return new Set(seen.keys());
  };
  const a = await run(7);
  assert.equal(a.size, 6, 'six samples, six (prompt, seed) pairs');
  for (const k of a) assert.ok(Number(k.split('#')[1]) < 2 ** 31);
  assert.deepEqual(await run(7, [...problems].reverse()), a, 'the same seeds each run, in any order');
  const b = await run(8);
  assert.equal([...b].filter((k) => a.has(k)).length, 0, 'a neighbouring seed shares no sample');
});

test('a slow tool call does not block other trajectories', async () => {
  const slowRunner = new FakeRunner(undefined, 300);
  const e = new FakeEngine((ids) => {
    const q = decode(ids);
    const seen = q.includes('<tool_response>');
    if (q.includes('slow') && !seen) return { outputIds: encode(`${CALL}<|im_end|>`) };
    return { outputIds: encode('done<|im_end|>') };
  });
  const order: string[] = [];
  for await (const t of streamRollouts({
    engines: [e],
    schedulerOptions: { pollMs: 0 },
    template,
    runner: slowRunner,
    problems: [
      { id: 'slow', question: 'slow' },
      ...Array.from({ length: 5 }, (_, i) => ({ id: `fast${i}`, question: 'fast' })),
    ],
  })) {
    order.push(t.promptId);
  }
  assert.equal(order.at(-1), 'slow');
  assert.equal(order.length, 6);
});

test('bad input is reported on the trajectory', async () => {
  const e = scripted(['a<|im_end|>']);
  const sched = await Scheduler.create([e], { pollMs: 0, policy: 'kv-budget' });
  const t = await runTrajectory({ id: 'empty' }, 0, sched, {
    template: { ...template, promptIds: () => [] },
    runner: new FakeRunner(),
  });
  assert.equal(t.finish, 'error');
  assert.match(t.error ?? '', /neither promptIds nor question/);
  const big = await runTrajectory({ id: 'big', question: 'q' }, 0, sched, {
    template,
    runner: new FakeRunner(),
    maxResponseTokens: 10 << 20,
  });
  assert.equal(big.finish, 'error');
  assert.match(big.error ?? '', /exceeds the largest engine KV capacity/);
  await sched.close();
  await assert.rejects(async () => {
    for await (const _ of streamRollouts({ template, runner: new FakeRunner(), problems: [] })) {
    }
  }, /needs `scheduler` or `engines`/);
});

test('aborting a rollout still yields a record for every trajectory (running and still queued)', async () => {
  const slow = new FakeEngine(() => ({ outputIds: encode('never<|im_end|>'), delayMs: 5000 }), {
    capacityTokens: 3000,
  });
  const ac = new AbortController();
  setTimeout(() => ac.abort(), 100);
  const ts = await runRollouts({
    engines: [slow],
    schedulerOptions: { pollMs: 0, policy: 'kv-budget' },
    template,
    runner: new FakeRunner(),
    problems: Array.from({ length: 4 }, (_, i) => ({ id: `p${i}`, question: 'q' })),
    maxResponseTokens: 1000, // ~1.03k budget: 2 run, 2 wait for KV
    signal: ac.signal,
  });
  assert.equal(ts.length, 4);
  for (const t of ts) assert.equal(t.finish, 'error');
  assert.equal(ts.filter((t) => /aborted by caller/.test(t.error ?? '')).length, 2);
  assert.equal(ts.filter((t) => /aborted while waiting for KV/.test(t.error ?? '')).length, 2);
});

test('ids the tokenizer cannot decode still produce an error record', async () => {
  const e = new FakeEngine(() => ({ outputIds: [999_999, IM_END] }));
  const strict = {
    ...template,
    decode: (ids: number[]) => {
      if (ids.some((i) => i > 100_000)) throw new RangeError('token id 999999 is not in the vocabulary');
      return decode(ids);
    },
  };
  const ts = await runRollouts({
    engines: [e],
    schedulerOptions: { pollMs: 0 },
    template: strict,
    runner: new FakeRunner(),
    problems: [{ id: 'x', question: 'q' }],
    n: 2,
  });
  assert.equal(ts.length, 2);
  for (const t of ts) {
    assert.equal(t.finish, 'error');
    assert.match(t.error ?? '', /cannot decode response: token id 999999/);
    assert.deepEqual(t.responseIds, [999_999, IM_END]);
  }
});

test('a rollout reports its stats, and kv-predict learns lengths from it for the next rollout', async () => {
  const prompt = template.promptIds('q').length;
  // room for 2 worst-case trajectories (budget 2000) but 8 of the ~60-token ones this model writes
  const slow = (text: string) => () => ({ outputIds: encode(text), delayMs: 5 });
  const e = scripted([slow(`${CALL}<|im_end|>`), slow('\\boxed{2}<|im_end|>')], 'e', 2 * (prompt + 2000));
  const sched = await Scheduler.create([e], { pollMs: 0, policy: 'kv-predict' });
  const roll = async () => {
    let stats: RolloutStats | undefined;
    e.maxActive = 0;
    const ts = await runRollouts({
      scheduler: sched,
      template,
      runner: new FakeRunner(),
      problems: Array.from({ length: 4 }, (_, i) => ({ id: `p${i}`, question: 'q' })),
      n: 2,
      maxResponseTokens: 2000,
      onRolloutStats: (s) => {
        stats = s;
      },
    });
    for (const t of ts) assert.equal(t.finish, 'answered', t.error);
    return {
      stats: stats as RolloutStats,
      maxActive: e.maxActive,
      lengths: ts.map((t) => t.responseIds.length),
    };
  };
  const first = await roll();
  assert.equal(first.maxActive, 8, 'no lengths yet: everything is placed up front (static split)');
  assert.ok(first.stats.makespan_s > 0 && first.stats.tail_s <= first.stats.makespan_s);
  assert.ok(first.stats.idle_frac >= 0 && first.stats.idle_frac < 1);
  assert.equal(first.stats.moved, 0);
  assert.ok(sched.lengths.trained);
  const second = await roll();
  assert.equal(second.maxActive, 8, 'predicted lengths fit: everything at once, not 2 worst-case budgets');
  const mean = first.lengths.reduce((a, b) => a + b, 0) / first.lengths.length;
  assert.ok(
    Math.abs(sched.lengths.predict('p0', 0) - mean) < 1,
    'the prediction is the last rollout’s length',
  );
  assert.deepEqual(sched.ledger.active, [0]);
  await sched.close();
});

test('an engine that dies mid-rollout: its trajectories finish on the other engine, every record answered', async () => {
  const a = scripted([`${CALL}<|im_end|>`, '\\boxed{2}<|im_end|>'], 'a');
  const b = scripted([`${CALL}<|im_end|>`, '\\boxed{2}<|im_end|>'], 'b');
  let dead = false;
  const realGenerate = a.generate.bind(a);
  a.generate = async (ids, s, signal) => {
    // the first turn runs, then the engine dies: every later call fails and so does its load check
    if (decode(ids).includes('<tool_response>')) dead = true;
    return dead
      ? { outputIds: [], logprobs: [], finishReason: 'error', error: 'ECONNREFUSED' }
      : realGenerate(ids, s, signal);
  };
  a.load = async () => {
    if (dead) throw new Error('ECONNREFUSED');
    return { capacityTokens: 1 << 20 };
  };
  const sched = await Scheduler.create([a, b], { pollMs: 0, policy: 'round-robin' });
  let stats: RolloutStats | undefined;
  const ts = await runRollouts({
    scheduler: sched,
    template,
    runner: new FakeRunner(),
    problems: Array.from({ length: 3 }, (_, i) => ({ id: `p${i}`, question: 'q' })),
    n: 2,
    onRolloutStats: (s) => {
      stats = s;
    },
  });
  assert.equal(ts.length, 6);
  for (const t of ts) {
    assert.equal(t.finish, 'answered', t.error);
    assert.equal(t.engine, 'b');
    checkAligned(t);
  }
  assert.equal(stats?.moved, 3, 'the three trajectories placed on a moved');
  assert.deepEqual(sched.down, [true, false]);
  await sched.close();
});
