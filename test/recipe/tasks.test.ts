import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { test } from 'node:test';
import { agentTemplate } from '../../src/agent/template.js';
import { type ChatExample, chatSegments } from '../../src/data/index.js';
import { loadRecipe, parseRecipe } from '../../src/recipe/config.js';
import {
  answerText,
  demoStyle,
  echoOf,
  FIX_NOTE,
  generateProblems,
  MAX_LEVEL,
  sftExamples,
  splitOf,
  TASK_KINDS,
  toolCallText,
  toolObservationText,
} from '../../src/recipe/tasks.js';
import { scoreTrajectory } from '../../src/reward/index.js';
import type { Trajectory } from '../../src/rl/trajectory.js';
import { executePythonTool } from '../../src/sandbox/tool.js';
import { buildCharTokenizer, ChatTemplate, tokenizerFromFiles } from '../../src/tokenizer/index.js';
import { SpawnRunner } from '../sandbox/helpers.js';

test('problems are deterministic, distinct, and the train/test split is disjoint by question', () => {
  const a = generateProblems({ seed: 3, n: 300, split: 'train', levels: [0, 1, 2, 3] });
  assert.deepEqual(generateProblems({ seed: 3, n: 300, split: 'train', levels: [0, 1, 2, 3] }), a);
  assert.equal(new Set(a.map((p) => p.question)).size, 300);
  const test1 = generateProblems({ seed: 3, n: 200, split: 'test', levels: [0, 1, 2, 3] });
  const test2 = generateProblems({ seed: 99, n: 200, split: 'test', levels: [1, 2] });
  const train = new Set(a.map((p) => p.question));
  for (const p of [...test1, ...test2]) assert.ok(!train.has(p.question), p.question);
  for (const p of a) assert.equal(splitOf(p.question), 'train');
  assert.deepEqual(new Set(a.map((p) => p.kind)), new Set(TASK_KINDS));
  assert.ok(a.every((p) => p.level >= 0 && p.level <= MAX_LEVEL && /^-?\d+$/.test(p.answer)));
});

test('every problem program prints its answer under real Python', { timeout: 60_000 }, () => {
  const ps = generateProblems({ seed: 5, n: 120, split: 'train', levels: [0, 1, 2, 3] });
  const script = ps.map((p) => p.code.replace(/;/g, '\n')).join('\n');
  const out = execFileSync('/usr/bin/python3', ['-c', script], { encoding: 'utf8' }).trim().split('\n');
  assert.deepEqual(
    out,
    ps.map((p) => p.answer),
  );
});

test('bad task specs get clear errors', () => {
  assert.throws(() => generateProblems({ seed: 1, n: 1, split: 'train', levels: [] }), /no levels/);
  assert.throws(
    () => generateProblems({ seed: 1, n: 1, split: 'train', levels: [0], kinds: ['nope' as never] }),
    /unknown task kind "nope"/,
  );
});

// The generated demos as the trainer renders them: chat examples through data/'s one SFT path.
const rendered = (ex: ChatExample) => chatSegments(ex).segments;

test('SFT demos follow the mix and the compact format; tool output is masked, direct guesses are wrong', () => {
  const ps = generateProblems({ seed: 2, n: 600, split: 'train', levels: [1, 2, 3] });
  const demos = sftExamples(ps, { direct: 1, tool: 1, recover: 1 }, 4);
  const count = (s: string) => demos.filter((d) => demoStyle(d) === s).length;
  for (const s of ['direct', 'tool', 'recover'])
    assert.ok(count(s) > 150 && count(s) < 250, `${s}: ${count(s)}`);
  for (const [i, d] of demos.entries()) {
    const p = ps[i];
    assert.equal(d.messages[0].content, p.question);
    const segs = rendered(d);
    const last = segs[segs.length - 1];
    assert.ok(last.role === 'assistant' && last.text.endsWith('</answer>'));
    if (demoStyle(d) === 'direct') {
      assert.equal(segs.length, 1);
      assert.ok(
        !last.text.includes(`\\boxed{${p.answer}}`),
        'direct demos on hard problems must not teach answers',
      );
    } else {
      const obs = segs.flatMap((s) => (s.role === 'tool' ? s.texts : []));
      assert.equal(obs.length, demoStyle(d) === 'tool' ? 1 : 2);
      assert.ok(obs[obs.length - 1].includes(`stdout: ${p.answer}\n`));
      assert.ok(last.text.includes(`\\boxed{${p.answer}}`));
      if (demoStyle(d) === 'recover') assert.match(obs[0], /Error/);
    }
  }
});

test('a demo renders to the exact ids of the rollout text it teaches (prompt, calls, masked tool turns)', () => {
  const tok = tokenizerFromFiles(buildCharTokenizer({ template: 'quick' }));
  const tpl = agentTemplate(tok, { chat: ChatTemplate.named('quick') });
  const ps = generateProblems({ seed: 5, n: 30, split: 'train', levels: [1], kinds: ['mul'] });
  for (const [i, ex] of sftExamples(ps, { direct: 1, tool: 1, recover: 1 }, 9, { echo: true }).entries()) {
    // the text a rollout of this demo contains, written out by hand from the tool-call and answer formats
    let text = '';
    const segs = rendered(ex);
    for (const s of segs)
      text += s.role === 'assistant' ? `${s.text}<|im_end|>` : toolObservationText(s.texts[0]);
    const style = demoStyle(ex);
    const thought = echoOf(ps[i].question);
    if (style === 'direct')
      assert.match(text, new RegExp(`^${thought.replace('*', '\\*')}</reason> <answer> `));
    else
      assert.ok(
        text.startsWith(thought + (style === 'tool' ? toolCallText(ps[i].code) : '</reason>\n<tool_call>')),
      );
    assert.ok(text.endsWith(answerText(style === 'direct' ? /boxed\{(\d+)\}/.exec(text)![1] : ps[i].answer)));
    // ...and the token ids the SFT path builds are those of that text after the prompt
    const ids = [...tpl.promptIds(ps[i].question)];
    for (const s of segs)
      ids.push(
        ...(s.role === 'assistant'
          ? [...tok.encode(s.text, { addSpecialTokens: false }), tok.imEnd]
          : tpl.toolTurnIds(s.texts)),
      );
    assert.deepEqual(ids, [
      ...tpl.promptIds(ps[i].question),
      ...tok.encode(text, { addSpecialTokens: false }),
    ]);
  }
});

function traj(text: string, finish: Trajectory['finish'] = 'answered'): Trajectory {
  return {
    id: 'a#0',
    promptId: 'a',
    sample: 0,
    promptIds: [],
    responseIds: [],
    responseMask: [],
    responseLogprobs: [],
    events: [],
    finish,
    text,
    numToolCalls: 0,
    numToolErrors: 0,
    ms: 0,
  };
}

test('integer reward: only a boxed answer counts, integers compare by value', () => {
  const integerReward = (t: Trajectory, gold: string) => scoreTrajectory(t, gold, 'integer');
  assert.equal(integerReward(traj('</reason> <answer> \\boxed{042} </answer>'), '42').reward, 1);
  assert.equal(integerReward(traj('\\boxed{1,234}'), '1234').reward, 1);
  assert.equal(integerReward(traj('\\boxed{43}'), '42').reward, 0);
  assert.equal(integerReward(traj('stdout: 42\n'), '42').reward, 0);
  assert.equal(integerReward(traj('\\boxed{42}', 'error'), '42').reward, 0);
});

test('recipes: quickstart loads with defaults, --roc overrides, bad input names the problem', () => {
  const q = loadRecipe('quickstart');
  assert.equal(q.stages[0].type, 'sft');
  const rl = q.stages.find((s) => s.type === 'rl')!;
  assert.ok(rl.type === 'rl' && rl.roc.doDownSampling && rl.roc.formatTurns === 'paper');
  const off = loadRecipe('quickstart', { roc: 'off' });
  assert.ok(off.stages.every((s) => s.type !== 'rl' || !s.roc.doDownSampling));
  assert.throws(() => loadRecipe('paper'), /stage sft has no data: give stages.sft.data.files/);
  const paper = loadRecipe('paper', { set: ['data.sft=s.jsonl', 'data.train=t.parquet'] });
  assert.equal(paper.stages.length, 4);
  assert.ok(paper.stages.every((s) => s.data.files?.[0] === (s.type === 'sft' ? 's.jsonl' : 't.parquet')));
  // the shorthand where every stage of its kind has files of its own would be ignored: refused by name
  const own = {
    eval: { generate: true },
    stages: [{ name: 'go', type: 'rl', data: { files: ['a.jsonl'] } }],
  };
  assert.throws(
    () => parseRecipe(own, 'r', { set: ['data.train=b.jsonl'] }),
    /--set data\.train: every rl stage \(go\) lists its own files/,
  );
  assert.throws(() => parseRecipe(own, 'r', { set: ['data.sft=b.jsonl'] }), /the recipe has no sft stage/);
  const mem = (r: typeof q) => [
    r.model.precision,
    r.model.gradientCheckpointing,
    r.model.maxTokensPerMicroBatch,
  ];
  assert.deepEqual(mem(q), ['fp32', false, null]);
  assert.deepEqual(mem(paper), ['bf16-mixed', true, 20480]);
  assert.throws(
    () => parseRecipe({ model: { precision: 'fp16' }, stages: [{ type: 'rl' }] }),
    /model\.precision: .*"fp32"\|"bf16-mixed"\|"bf16"/,
  );
  assert.throws(
    () => parseRecipe({ model: { maxTokensPerMicroBatch: 0 }, stages: [{ type: 'rl' }] }),
    /model\.maxTokensPerMicroBatch: .*>=1/,
  );
  assert.throws(() => parseRecipe({ stages: [{ type: 'rl', steps: -1 }] }), /stages\.rl\.steps/);
  assert.throws(() => parseRecipe({ stages: [{ type: 'rl', bogus: 1 }] }), /bogus/);
  assert.throws(() => parseRecipe({ stages: [] }), /stages/);
  assert.throws(
    () =>
      parseRecipe({
        stages: [
          { type: 'rl', groupSize: 3, roc: { minZeroRewardTraceNum: 2, minNonZeroRewardTraceNum: 2 } },
        ],
      }),
    /must be <= groupSize/,
  );
  assert.throws(
    () => parseRecipe({ stages: [{ type: 'sft' }, { type: 'sft' }] }),
    /duplicate stage name "sft"/,
  );
  assert.throws(() => loadRecipe('no-such-recipe'), /recipe not found: no-such-recipe/);
});

test('echo demos restate the expression first; the quick template keeps the compact structure', () => {
  assert.equal(echoOf('What is 48213*7719?'), '48213*7719');
  const ps = generateProblems({ seed: 3, n: 60, split: 'train', levels: [1, 2], kinds: ['add', 'mul'] });
  const demos = sftExamples(ps, { direct: 1, tool: 1, recover: 1 }, 5, { echo: true });
  for (const [i, d] of demos.entries()) {
    const segs = rendered(d);
    const first = segs[0];
    assert.ok(first.role === 'assistant' && first.text.startsWith(`${echoOf(ps[i].question)}</reason>`));
    const call = segs[segs.length - 3];
    // a fixing turn restates the expression like a first turn (after its note), then calls print on it
    const note = demoStyle(d) === 'recover' ? FIX_NOTE : '';
    if (demoStyle(d) !== 'direct')
      assert.ok(
        call.role === 'assistant' &&
          call.text.startsWith(`${note}${echoOf(ps[i].question)}</reason>`) &&
          call.text.includes(`print(${echoOf(ps[i].question)})`),
      );
  }
  const tok = tokenizerFromFiles(buildCharTokenizer({ template: 'quick' }));
  const tpl = agentTemplate(tok, { chat: ChatTemplate.named('quick') });
  assert.equal(
    tok.decode(tpl.promptIds('What is 1+2?')),
    '<|im_start|>system\nUse python.<|im_end|>\n<|im_start|>user\nWhat is 1+2?<|im_end|>\n<|im_start|>assistant\n<reason>',
  );
  const r = parseRecipe({ eval: { kinds: ['mul'] }, stages: [{ type: 'sft', echo: true }] });
  assert.deepEqual(r.eval.kinds, ['mul']);
});

test('recovery demos show the python tool the exact failure text it returns for the broken call', async () => {
  const ps = generateProblems({ seed: 4, n: 40, split: 'train', levels: [1, 2], kinds: ['mul', 'gcd'] });
  const demos = sftExamples(ps, { direct: 0, tool: 0, recover: 1 }, 6, { echo: true }).map(rendered);
  const runner = new SpawnRunner();
  const seen = new Set<string>();
  for (const d of demos.slice(0, 12)) {
    const [first, obs] = d;
    assert.ok(first.role === 'assistant' && obs.role === 'tool');
    const call = /<tool_call>\n(.*)\n<\/tool_call>/.exec(first.text);
    assert.ok(call, first.text);
    const args = JSON.parse(call[1]).arguments;
    const real = await executePythonTool(args, runner);
    assert.ok(real.error, `the broken call must fail: ${args.code}`);
    // the demo's observation is the tool's text up to the measured execution time
    const shown = obs.texts[0].replace(/execution time: [\d.]+s/, 'execution time: Xs');
    assert.ok(
      shown.includes(real.text.replace(/execution time: [\d.]+s/, 'execution time: Xs')),
      `${shown}\n---\n${real.text}`,
    );
    seen.add(real.text.split('\n')[2]);
  }
  assert.deepEqual(
    [...seen].sort(),
    ['pint', 'prnt'].map((n) => `stderr: NameError at line 1: name '${n}' is not defined`),
  );
});

test('a fixing turn restates the expression at one offset after the failing line, the offset the answer copies stdout at', () => {
  // 3-digit x 2-digit products, as the quickstart's: every expression is 6 characters
  const ps = generateProblems({ seed: 5, n: 200, split: 'train', levels: [1], kinds: ['mul'] });
  const demos = sftExamples(ps, { direct: 0, tool: 0, recover: 1 }, 7, { echo: true });
  const offsets = new Set<string>();
  const failures = new Set<string>();
  for (const [i, d] of demos.entries()) {
    const [first, obs] = rendered(d);
    assert.ok(first.role === 'assistant' && obs.role === 'tool');
    const expr = echoOf(ps[i].question);
    // what the fixing turn's restatement follows: the first turn, then the tool's text
    const before = first.text + obs.texts[0];
    failures.add(obs.texts[0].split('\n')[2]);
    offsets.add([before.indexOf(expr), before.lastIndexOf(expr), before.length].join());
  }
  assert.equal(failures.size, 2);
  assert.equal(offsets.size, 1, [...offsets].join(' | '));
  // in tokens, the restatement is as far after the offending line's expression as the answer after stdout
  const tok = tokenizerFromFiles(buildCharTokenizer({ template: 'quick' }));
  const ids = (t: string) => tok.encode(t, { addSpecialTokens: false });
  const after = (seq: number[], what: string, from = 0) => {
    const w = ids(what);
    for (let i = from; i + w.length <= seq.length; i++)
      if (w.every((x, k) => seq[i + k] === x)) return i + w.length;
    throw new Error(`${what} not found`);
  };
  for (const [i, d] of demos.slice(0, 20).entries()) {
    const seq = ids(
      rendered(d)
        .map((g) => (g.role === 'assistant' ? `${g.text}<|im_end|>` : toolObservationText(g.texts[0])))
        .join(''),
    );
    const expr = echoOf(ps[i].question);
    const line = after(seq, `\n  p`) + 4; // the offending line: two spaces, then prnt( or pint(
    const restated = after(seq, FIX_NOTE, line);
    const stdout = after(seq, 'stdout: ');
    const boxed = after(seq, '\\boxed{', stdout);
    assert.deepEqual(seq.slice(line, line + expr.length), ids(expr));
    assert.deepEqual(seq.slice(restated, restated + expr.length), ids(expr));
    assert.equal(restated - line, boxed - stdout);
  }
});

test('a recovery demo shows its failing call without training it (weight 0); every other turn is trained', () => {
  const ps = generateProblems({ seed: 3, n: 300, split: 'train', levels: [1], kinds: ['mul'] });
  const demos = sftExamples(ps, { direct: 1, tool: 1, recover: 1 }, 11, { echo: true });
  const styles = new Set<string>();
  for (const d of demos) {
    const turns = d.messages.filter((m) => m.role === 'assistant');
    styles.add(demoStyle(d));
    const shown = turns.map((m) => m.weight === 0);
    assert.deepEqual(
      shown,
      turns.map((_, i) => demoStyle(d) === 'recover' && i === 0),
    );
    if (demoStyle(d) === 'recover')
      assert.match(String(turns[0].tool_calls?.[0].function.arguments.code), /^(prnt|pint)\(/);
  }
  assert.equal(styles.size, 3);
});

test('trainFailedCalls trains that share of the failing calls and shows the rest', () => {
  const ps = generateProblems({ seed: 3, n: 2000, split: 'train', levels: [1], kinds: ['mul'] });
  const share = (t: number) => {
    const recover = sftExamples(ps, { direct: 0, tool: 0, recover: 1 }, 11, { trainFailedCalls: t });
    return recover.filter((d) => d.messages[1].weight !== 0).length / recover.length;
  };
  assert.equal(share(0), 0);
  assert.equal(share(1), 1);
  const q = share(0.25);
  assert.ok(q > 0.22 && q < 0.28, String(q));
});
