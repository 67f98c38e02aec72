// Agent-loop controller throughput: an engine that answers instantly drives many trajectories of
// 5 assistant turns (4 tool calls each) through the real loop, tokenizer and rStar2 chat template.
// Reports assistant turns per second (a) with an instant fake sandbox — the controller alone — and
// (b) with the embedded sandbox pool (bubblewrap), where Python start-up is the bound.
//
// Run: flock /tmp/bench.lock npx tsx bench/agent-loop.ts [--trajectories 512] [--n 8] [--pool-trajectories 64] [--no-pool]
import { type AgentTemplate, runRollouts } from '../src/agent/loop.js';
import { agentTemplate } from '../src/agent/template.js';
import { FakeEngine } from '../src/engines/fake.js';
import { Scheduler } from '../src/engines/scheduler.js';
import { SandboxPool } from '../src/sandbox/pool.js';
import type { CodeRunner, RunRequest, RunResult } from '../src/sandbox/types.js';
import { buildCharTokenizer, tokenizerFromFiles } from '../src/tokenizer/index.js';
import { benchArgs } from './args.js';

const { values } = benchArgs(import.meta.url, {
  options: {
    trajectories: { type: 'string', default: '512' },
    'pool-trajectories': { type: 'string', default: '64' },
    n: { type: 'string', default: '8' },
    'no-pool': { type: 'boolean', default: false },
  },
});
const [N, N_POOL, SAMPLES] = [values.trajectories, values['pool-trajectories'], values.n].map(Number);
for (const [k, v] of Object.entries({ trajectories: N, 'pool-trajectories': N_POOL, n: SAMPLES }))
  if (!(Number.isInteger(v) && v > 0)) throw new Error(`--${k} must be a positive integer`);

const tok = tokenizerFromFiles(buildCharTokenizer());
const template = agentTemplate(tok);
const CALL = tok.encode(
  'Compute it.\n<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(6*7)", "input": ""}}\n</tool_call><|im_end|>',
  { addSpecialTokens: false },
);
const lps = CALL.map(() => -0.1);
const engine = new FakeEngine(() => ({ outputIds: CALL, logprobs: lps }), { capacityTokens: 1 << 30 });

// The same ids through a trivial template (one id per char, no Jinja/HF tokenizer): isolates the
// loop's own cost from tokenizer + template rendering.
const IM_END = tok.imEnd;
const PIECE = Array.from({ length: tok.vocabSize }, (_, i) => tok.decode([i])); // char tokenizer: 1 id = 1 char
const charIds = (s: string) => Array.from(s, (c) => 1000 + c.charCodeAt(0));
const trivial: AgentTemplate = {
  promptIds: (q) => charIds(`user: ${q}\nassistant: <reason>`),
  toolTurnIds: (texts) =>
    charIds(`user: <tool_response>${texts.join('')}</tool_response>\nassistant: <reason>`),
  decode: (ids) => ids.map((i) => (i >= 1000 ? String.fromCharCode(i - 1000) : PIECE[i])).join(''),
  stopTokenIds: [IM_END],
};

const instant: CodeRunner = {
  run: async (r: RunRequest) => (await instant.runBatch([r]))[0],
  runBatch: async (reqs: RunRequest[]): Promise<RunResult[]> =>
    reqs.map(() => ({
      status: 'ok',
      exitCode: 0,
      signal: null,
      stdout: '42\n',
      stderr: '',
      truncated: false,
      timedOut: false,
      oom: false,
      wallMs: 1,
      cpuMs: 1,
      peakMemoryKb: 1,
    })),
  close: async () => {},
};

async function measure(label: string, runner: CodeRunner, n: number, tpl = template): Promise<number> {
  const scheduler = await Scheduler.create([engine], { pollMs: 0 });
  const k = Math.min(SAMPLES, n);
  const problems = Array.from({ length: Math.ceil(n / k) }, (_, i) => ({
    id: `q${i}`,
    question: `What is 6*7? (#${i})`,
  }));
  const t0 = performance.now();
  const ts = await runRollouts({ scheduler, template: tpl, runner, problems, n: k, maxResponseTokens: 8192 });
  const secs = (performance.now() - t0) / 1000;
  await scheduler.close();
  const turns = ts.reduce((a, t) => a + t.events.filter((e) => e.kind === 'generation').length, 0);
  const calls = ts.reduce((a, t) => a + t.numToolCalls, 0);
  const errors = ts.reduce((a, t) => a + t.numToolErrors, 0);
  const rate = turns / secs;
  console.log(
    `${label.padEnd(22)} trajectories ${ts.length} (n=${k})  turns ${turns}  tool calls ${calls} (errors ${errors})  ` +
      `${secs.toFixed(2)} s  ${rate.toFixed(0)} turns/s`,
  );
  return rate;
}

await measure('warm-up', instant, 32);
const rates: number[] = [];
for (let i = 0; i < 3; i++) rates.push(await measure('instant sandbox', instant, N));
rates.sort((a, b) => a - b);
console.log(
  `controller median (rstar2 template + HF tokenizer): ${rates[1].toFixed(0)} turns/s (target ≥ 2000)`,
);
const loopOnly: number[] = [];
for (let i = 0; i < 3; i++) loopOnly.push(await measure('trivial template', instant, N, trivial));
loopOnly.sort((a, b) => a - b);
console.log(`loop-only median: ${loopOnly[1].toFixed(0)} turns/s`);
if (!values['no-pool']) {
  const pool = await SandboxPool.start();
  try {
    await measure('embedded sandbox pool', pool, N_POOL);
  } finally {
    await pool.close();
  }
}
