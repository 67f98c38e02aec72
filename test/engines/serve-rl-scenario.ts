import assert from 'node:assert/strict';
import { join } from 'node:path';
import { SGLangEngine } from '../../src/engines/sglang.js';
import { parseRecipe } from '../../src/recipe/config.js';
import { EmbeddedPolicy } from '../../src/recipe/policy.js';
import type { Trajectory } from '../../src/rl/trajectory.js';
import { initModelDir } from '../../src/worker/init-model.js';
import { SpawnRunner } from '../sandbox/helpers.js';
import { maxAbsDiff, sampling } from '../worker/helpers.js';
import type { ServeProcess } from './serve-process.js';

// The disaggregated RL path live on CPU (issue 52 item 4), run by serve-rl.test.ts on loopback and in network
// namespaces: a trainer (this process) and two `rstar2 serve` engines, each its own process, started by `start`
// (which the caller also stops), weights broadcast over gloo after every update. After each sync both engines'
// log-probs of a fixed prompt are the trainer's own; one engine killed mid-rollout loses no trajectory and is
// reported; restarted, it rejoins and serves the current weights.

export const SERVE_ENV = { RSTAR2_KV_TOKENS: '8192' };
export const SERVE_ARGS = ['--bucket-timeout', '10'];
const PROMPT = [5, 17, 33, 2, 80, 81, 82, 9, 40, 41];

export async function servedRl(
  dir: string,
  start: (model: string, o: { port?: number }) => Promise<ServeProcess>,
): Promise<void> {
  const trainerModel = join(dir, 'trainer');
  const otherModel = join(dir, 'other');
  await initModelDir({ preset: 'tiny', out: trainerModel, seed: 1 });
  await initModelDir({ preset: 'tiny', out: otherModel, seed: 2 });
  // the engines start on other weights than the trainer's: the first sync must replace them
  const [a, b] = await Promise.all([0, 1].map(() => start(otherModel, {})));
  const recipe = parseRecipe({
    model: { path: trainerModel, threads: 1 },
    stages: [{ type: 'rl', steps: 1 }],
  });
  const lines: string[] = [];
  const policy = await EmbeddedPolicy.create(recipe, {
    engines: [a, b].map((p) => new SGLangEngine(p.url, { log: () => {} })),
    syncDir: join(dir, 'sync'),
    runner: new SpawnRunner(),
    log: (l) => lines.push(l),
    weightSync: { mode: 'nccl', backend: 'gloo', timeoutS: 60, bucketTimeoutS: 10 },
  });
  const req = (n: number, maxResponseTokens: number, seed: number) => ({
    problems: Array.from({ length: n }, (_, i) => ({
      id: `p${i}`,
      question: `What is ${i}+1?`,
      answer: `${i + 1}`,
    })),
    n: 2,
    maxResponseTokens,
    maxTurns: 1,
    temperature: 1,
    seed,
  });
  // a fixed prompt sampled on each engine scores as the trainer scores it
  const same = async (urls: string[], what: string) => {
    for (const url of urls) {
      const r = await new SGLangEngine(url, { log: () => {} }).generate(
        PROMPT,
        sampling({ temperature: 1, maxNewTokens: 8, seed: 3 }),
      );
      assert.equal(r.finishReason, 'length', `${what} on ${url}: ${r.error}`);
      const traj = { promptIds: PROMPT, responseIds: r.outputIds } as unknown as Trajectory;
      const [own] = await policy.recomputeLogprobs([traj], 1);
      assert.ok(maxAbsDiff(r.logprobs, own) < 1e-4, `${what} on ${url}: ${r.logprobs} vs ${own}`);
    }
  };
  const update = async (trajs: Trajectory[]) => {
    await policy.grpoStep(
      trajs.map((trajectory, i) => ({ trajectory, advantage: i % 2 ? 1 : -1 })),
      { lr: 2e-2 },
    );
  };
  const synced = (v: string) => lines.filter((l) => l.startsWith(`weight sync ${v}: broadcast`)).length;
  try {
    let trajs = await policy.rollout(req(2, 16, 1));
    assert.equal(synced('v1'), 1, lines.join('\n'));
    await same([a.url, b.url], 'v1');
    await update(trajs);

    // v2 by broadcast; then engine b is killed while it holds trajectories
    const rollout = policy.rollout(req(4, 160, 2));
    for (let i = 0; i < 600; i++) {
      const load = (await (await fetch(`${b.url}/get_load`)).json()) as { num_reqs: number }[];
      if (load[0].num_reqs > 0) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    await b.stop('SIGKILL');
    trajs = await rollout;
    assert.equal(synced('v2'), 1, lines.join('\n'));
    assert.equal(trajs.length, 8);
    for (const t of trajs) assert.notEqual(t.finish, 'error', t.error);
    assert.ok((policy.lastRolloutStats()?.moved ?? 0) > 0, JSON.stringify(policy.lastRolloutStats()));
    assert.ok(
      lines.some((l) => l.startsWith(`warning: sglang:${b.url} stopped answering`)),
      lines.join('\n'),
    );
    await same([a.url], 'v2');
    await update(trajs);

    // restarted on its old weights and port: the next sync (disk: it left the group) gives it the current ones,
    // and the one after joins a new group and broadcasts again
    const b2 = await start(otherModel, { port: b.port });
    trajs = await policy.rollout(req(2, 16, 3));
    assert.ok(
      lines.some((l) => /^warning: weight sync: broadcast failed: .*the next joins a new group/.test(l)),
      lines.join('\n'),
    );
    await same([a.url, b2.url], 'v3');
    await update(trajs);
    trajs = await policy.rollout(req(2, 16, 4));
    assert.equal(synced('v4'), 1, lines.join('\n'));
    assert.equal(lines.filter((l) => l.startsWith('weight sync: joined')).length, 2);
    await same([a.url, b2.url], 'v4');
    assert.ok(lines.some((l) => l === `sglang:${b.url} answers again: it takes trajectories again`));
  } finally {
    await policy.close();
  }
}
