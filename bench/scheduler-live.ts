// Rollout scheduling, live: N engines side by side on this machine, each with its own KV pool of --kv-tokens, small
// enough to bind: built-in engines in-process (`--engines embedded,…`: a worker each), or with --serve N `rstar2
// serve` processes driven as SGLang servers (`sglang+URL`, issue 52 item 5), the path a run on served engines takes.
// Each policy (default kv-predict, round-robin, least-requests) runs --rollouts rollouts on its own scheduler for
// each of --seeds seeds, on the same problems and samples, the policies taking turns rollout by rollout
// (kv-predict learns its length prior from the rollout before, as in training, so the first rollout of each seed
// places like round-robin and is left out). --pin puts served engine i on core i mod cores (taskset). Tool calls
// run in the local sandbox. Prints each rollout's makespan, throughput (response tokens / makespan), p99 trajectory
// time, tail, re-prefilled tokens and retractions; then per policy the median throughput and p99 over seeds and
// rollouts, and each policy's throughput against round-robin's.
// The model should call tools and end its answers (a trained checkpoint: the quickstart's last one does); a random
// model's lengths follow its chance of sampling an end token, which no policy can predict.
//
//   npx tsx bench/scheduler-live.ts --model RUN/checkpoints/rl-step-000020 --data RUN/data/eval.jsonl
//        [--serve [--pin]] [--template quick] [--engines 4] [--kv-tokens 4096] [--problems 64] [--samples 8]
//        [--rollouts 3] [--seeds 1] [--max-response-tokens 720] [--max-turns 3] [--temperature 1]
//        [--policies kv-predict,round-robin,least-requests]
//
// On a GPU every engine shares it (RSTAR2_ENGINE splits the memory; --kv-tokens sets each pool). The simulation's
// figure for the same trajectories: `npx tsx bench/scheduler-sim.ts --replay RUN_DIR` (docs/DECISIONS.md).
import { type ChildProcess, spawn } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { runRollouts } from '../src/agent/loop.js';
import { openRolloutStack } from '../src/agent/stack.js';
import { loadProblems } from '../src/data/index.js';
import type { RolloutStats, RoutingPolicy } from '../src/engines/scheduler.js';
import { freePort } from '../src/util/net.js';
import { benchArgs, median } from './args.js';

const { values: v } = benchArgs(import.meta.url, {
  options: {
    model: { type: 'string' },
    data: { type: 'string' },
    serve: { type: 'boolean', default: false },
    pin: { type: 'boolean', default: false },
    template: { type: 'string', default: 'quick' },
    engines: { type: 'string', default: '4' },
    'kv-tokens': { type: 'string', default: '4096' },
    problems: { type: 'string', default: '64' },
    samples: { type: 'string', default: '8' },
    rollouts: { type: 'string', default: '3' },
    seeds: { type: 'string', default: '1' },
    'max-response-tokens': { type: 'string', default: '720' },
    'max-turns': { type: 'string', default: '3' },
    temperature: { type: 'string', default: '1' },
    policies: { type: 'string', default: 'kv-predict,round-robin,least-requests' },
  },
});
if (!v.model || !v.data) {
  console.error('scheduler-live: --model DIR and --data FILE are needed (--help)');
  process.exit(2);
}
const num = (k: keyof typeof v) => Number(v[k]);
const cpus = availableParallelism();
if (v.pin && !v.serve) {
  console.error('scheduler-live: --pin pins served engines: it needs --serve');
  process.exit(2);
}
// every worker this process starts inherits it, and so does every rstar2 serve
process.env.RSTAR2_KV_TOKENS = String(num('kv-tokens'));
const problems = (await loadProblems(v.data, { layout: 'plain' })).slice(0, num('problems'));
const p99 = (xs: number[]) =>
  [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * 0.99))];

/** `rstar2 serve` processes on free ports, each answering /health; stopped by the caller. */
async function serveEngines(n: number): Promise<{ urls: string[]; procs: ChildProcess[] }> {
  const procs: ChildProcess[] = [];
  const urls: string[] = [];
  for (let i = 0; i < n; i++) {
    const port = await freePort('127.0.0.1');
    const args = [
      'bin/rstar2.js',
      'serve',
      '--model',
      v.model as string,
      '--port',
      String(port),
      '--threads',
      '1',
    ];
    // --pin: engine i on core i mod cores, as engines on their own GPUs are; unpinned, engines that share cores
    // trade CPU, and an idle engine's core goes to the busy one, which hides what placement costs
    const cmd = v.pin
      ? ['taskset', '-c', String(i % cpus), process.execPath, ...args]
      : [process.execPath, ...args];
    const p = spawn(cmd[0], cmd.slice(1), { stdio: ['ignore', 'ignore', 'inherit'] });
    procs.push(p);
    urls.push(`http://127.0.0.1:${port}`);
  }
  const deadline = Date.now() + 300_000;
  for (const u of urls)
    while (
      !(await fetch(`${u}/health`).then(
        (r) => r.ok,
        () => false,
      ))
    ) {
      if (Date.now() > deadline) throw new Error(`rstar2 serve at ${u} did not start in 300 s`);
      await new Promise((r) => setTimeout(r, 500));
    }
  return { urls, procs };
}

const served = v.serve ? await serveEngines(num('engines')) : null;
const policies = v.policies.split(',') as RoutingPolicy[];
const rows: Record<string, { tokS: number[]; p99: number[] }> = {};
for (const policy of policies) rows[policy] = { tokS: [], p99: [] };
try {
  for (let seed = 0; seed < num('seeds'); seed++) {
    // one stack per policy, kept over the seed's rollouts (kv-predict's prior is the rollout before), and the
    // policies take turns rollout by rollout: a host whose load drifts then moves every policy's figures alike
    const stacks = [];
    for (const policy of policies)
      stacks.push(
        await openRolloutStack({
          engines: served
            ? served.urls.map((u) => `sglang+${u}`)
            : Array.from({ length: num('engines') }, () => 'embedded'),
          model: v.model,
          template: v.template,
          sandbox: 'embedded',
          scheduler: { policy },
        }),
      );
    try {
      for (let k = 0; k < num('rollouts'); k++)
        for (const [i, policy] of policies.entries()) {
          const stack = stacks[i];
          let stats: RolloutStats | undefined;
          const ts = await runRollouts({
            scheduler: stack.scheduler,
            template: stack.template,
            runner: stack.runner,
            problems: problems.map((p) => ({ id: p.id, question: p.question })),
            n: num('samples'),
            maxResponseTokens: num('max-response-tokens'),
            maxTurns: num('max-turns'),
            sampling: { temperature: num('temperature'), seed: 1000 * (seed + 1) + k },
            onRolloutStats: (st) => {
              stats = st;
            },
          });
          const failed = ts.filter((t) => t.finish === 'error').length;
          const tokens = ts.reduce((a, t) => a + t.responseIds.length, 0);
          const tokS = stats ? tokens / stats.makespan_s : 0;
          const slowest = p99(ts.map((t) => t.ms / 1000));
          console.log(
            `${policy} seed ${seed} rollout ${k}: makespan ${stats?.makespan_s} s, ${tokS.toFixed(0)} tokens/s, ` +
              `p99 ${slowest.toFixed(2)} s, tail ${stats?.tail_s} s, ${ts.length} trajectories (${failed} failed), ` +
              `${tokens} response tokens, re-prefilled ${stats?.reprefilled_tokens}, retractions ${stats?.retractions}`,
          );
          if (k > 0 && stats) {
            rows[policy].tokS.push(tokS);
            rows[policy].p99.push(slowest);
          }
        }
    } finally {
      for (const stack of stacks) await stack.close();
    }
  }
} finally {
  for (const p of served?.procs ?? []) p.kill('SIGTERM');
}
const base = rows['round-robin']?.tokS.length ? median(rows['round-robin'].tokS) : undefined;
for (const [policy, r] of Object.entries(rows)) {
  if (!r.tokS.length) continue;
  const tokS = median(r.tokS);
  console.log(
    `${policy}: median ${tokS.toFixed(0)} tokens/s, p99 ${median(r.p99).toFixed(2)} s over ${r.tokS.length} ` +
      `rollouts${base ? `; ${(tokS / base).toFixed(3)}× round-robin's throughput` : ''}`,
  );
}
