import assert from 'node:assert/strict';
import { getEventListeners } from 'node:events';
import { test } from 'node:test';
import { FakeEngine } from '../../src/engines/fake.js';
import { LengthModel, Overcommit } from '../../src/engines/predict.js';
import { AUTO_PREDICT_MIN_KV, KvLedger, type Lease, Scheduler } from '../../src/engines/scheduler.js';
import { DEFAULT_SAMPLING } from '../../src/engines/types.js';
import { Rng } from '../../src/util/rng.js';

const echo = (name: string, capacityTokens: number) =>
  new FakeEngine(() => ({ outputIds: [1] }), { name, capacityTokens });
const tick = () => new Promise((r) => setImmediate(r));

test('kv-budget places on the engine with most free credit and waits when none fits', async () => {
  const s = await Scheduler.create([echo('a', 1000), echo('b', 600)], { pollMs: 0, policy: 'kv-budget' });
  const l1 = await s.acquire(500);
  assert.equal(l1.index, 0);
  const l2 = await s.acquire(500);
  assert.equal(l2.index, 1); // a has 500 free, b 600
  const l3 = await s.acquire(500);
  assert.equal(l3.index, 0); // a 500, b 100
  const box: { got?: Lease } = {};
  const p = s.acquire(300).then((l) => {
    box.got = l;
  });
  await tick();
  assert.equal(s.ledger.active[1] + s.ledger.active[0], 3, 'no engine has 300 free: must wait');
  assert.equal(s.waiting(), 1);
  l2.release();
  l2.release(); // idempotent
  await p;
  assert.equal(box.got?.index, 1);
  assert.deepEqual(s.ledger.reserved, [1000, 300]);
  for (const l of [l1, l3, box.got as Lease]) l.release();
  assert.deepEqual(s.ledger.reserved, [0, 0]);
  assert.deepEqual(s.ledger.active, [0, 0]);
  await s.close();
});

test('kv-budget never over-subscribes under a random workload, and FIFO admission starves nobody', async () => {
  const caps = [5000, 3000, 8000, 4000];
  const s = await Scheduler.create(
    caps.map((c, i) => echo(`e${i}`, c)),
    { pollMs: 0, policy: 'kv-budget' },
  );
  const rng = new Rng(3);
  const order: number[] = [];
  await Promise.all(
    Array.from({ length: 200 }, async (_, i) => {
      const l = await s.acquire(rng.int(200, 2500));
      order.push(i);
      for (let k = 0; k < caps.length; k++) assert.ok(s.ledger.reserved[k] <= caps[k], 'over-subscribed');
      await new Promise((r) => setTimeout(r, rng.int(0, 3)));
      l.release();
    }),
  );
  assert.equal(order.length, 200);
  for (const [k, p] of s.ledger.peakReserved.entries()) assert.ok(p <= caps[k]);
  assert.deepEqual(s.ledger.reserved, [0, 0, 0, 0]);
  await s.close();
});

test('budget larger than any engine is an error, not a hang; budgetCoef scales credit', async () => {
  const s = await Scheduler.create([echo('a', 1000)], { pollMs: 0, budgetCoef: 2, policy: 'kv-budget' });
  await assert.rejects(s.acquire(600), /exceeds the largest engine KV capacity 500/);
  const l = await s.acquire(500);
  l.release();
  await s.close();
});

test('live load polling lowers free credit (foreign load) but is ignored on an idle engine', async () => {
  let usedA = 0;
  const a = new FakeEngine(() => ({ outputIds: [1] }), {
    name: 'a',
    capacityTokens: 1000,
    usedTokens: () => usedA,
  });
  const b = echo('b', 900);
  const s = await Scheduler.create([a, b], { pollMs: 0, policy: 'kv-budget' });
  const l1 = await s.acquire(100); // a: 900 free, b: 900 free → a (first max)
  assert.equal(l1.index, 0);
  usedA = 700; // someone else is using a's cache
  await s.poll();
  assert.equal(s.ledger.free(0), 300);
  const l2 = await s.acquire(400);
  assert.equal(l2.index, 1);
  l1.release();
  assert.equal(s.ledger.free(0), 1000, 'idle engine: cached prefixes are evictable');
  l2.release();
  await s.close();
});

test('abort while waiting and close() reject pending acquisitions', async () => {
  const s = await Scheduler.create([echo('a', 100)], { pollMs: 0, policy: 'kv-budget' });
  const l = await s.acquire(100);
  const ac = new AbortController();
  const p1 = s.acquire(50, ac.signal);
  const p2 = s.acquire(50);
  ac.abort();
  await assert.rejects(p1, /aborted while waiting/);
  await s.close();
  await assert.rejects(p2, /scheduler closed/);
  l.release();
  await assert.rejects(s.acquire(1), /closed/);
});

test('least-requests and round-robin policies', async () => {
  const lr = await Scheduler.create([echo('a', 10), echo('b', 10), echo('c', 10)], {
    pollMs: 0,
    policy: 'least-requests',
  });
  const ls = [await lr.acquire(1000), await lr.acquire(1000), await lr.acquire(1000)]; // no KV admission
  assert.deepEqual(
    ls.map((l) => l.index),
    [0, 1, 2],
  );
  ls[1].release();
  assert.equal((await lr.acquire(1)).index, 1);
  const rr = new KvLedger([1, 1, 1]);
  assert.deepEqual(
    [0, 1, 2, 3].map(() => rr.choose('round-robin', 5)),
    [0, 1, 2, 0],
  );
  await assert.rejects(
    Scheduler.create([echo('a', 1)], { policy: 'bogus' as 'kv-budget' }),
    /unknown scheduler policy/,
  );
  await lr.close();
});

test('capacity read failures name the engine', async () => {
  const bad = new FakeEngine(() => ({ outputIds: [] }), { name: 'broken' });
  bad.load = async () => {
    throw new Error('ECONNREFUSED');
  };
  await assert.rejects(Scheduler.create([bad]), /cannot read KV capacity of broken: ECONNREFUSED/);
});

test('a caller signal shared by many trajectories keeps no listeners once they are served', async () => {
  const ac = new AbortController();
  const s = await Scheduler.create([echo('a', 1000)], { pollMs: 0, policy: 'kv-budget' });
  for (let i = 0; i < 30; i++) {
    const l = await s.acquire(800, ac.signal);
    const waitFor = s.acquire(900, ac.signal); // must wait for l's release
    await tick();
    l.release();
    (await waitFor).release();
  }
  assert.equal(getEventListeners(ac.signal, 'abort').length, 0);
  // and an abort still reaches a waiter that was never served
  const hold = await s.acquire(1000, ac.signal);
  const stuck = s.acquire(1000, ac.signal);
  ac.abort();
  await assert.rejects(stuck, /aborted while waiting for KV capacity/);
  hold.release();
  await s.close();
});

test('the default on small KV pools is the static split: round-robin, everything placed at once, KV never waited for', async () => {
  const s = await Scheduler.create([echo('a', 1000), echo('b', 1000), echo('c', 1000)], { pollMs: 0 });
  assert.equal(s.policy, 'round-robin');
  const ls = await Promise.all(Array.from({ length: 7 }, () => s.acquire(900)));
  assert.deepEqual(
    ls.map((l) => l.index),
    [0, 1, 2, 0, 1, 2, 0],
  );
  assert.equal(s.waiting(), 0, 'budgets far beyond the KV pools are placed anyway; the engines queue');
  for (const l of ls) l.release();
  assert.deepEqual(s.ledger.active, [0, 0, 0]);
  await s.close();
  // on pools where kv-predict wins in the simulation it is the default; one small engine keeps the static split
  const big = await Scheduler.create([echo('a', AUTO_PREDICT_MIN_KV), echo('b', 1_200_000)], { pollMs: 0 });
  assert.equal(big.policy, 'kv-predict');
  const mixed = await Scheduler.create([echo('a', 131_072), echo('b', 1_200_000)], { pollMs: 0 });
  assert.equal(mixed.policy, 'round-robin');
  await Promise.all([big.close(), mixed.close()]);
});

test('least-requests has no fixed cap: it places everything at once on the engine with the fewest', async () => {
  const s = await Scheduler.create([echo('a', 10), echo('b', 10)], { pollMs: 0, policy: 'least-requests' });
  const ls = await Promise.all(Array.from({ length: 100 }, () => s.acquire(1000)));
  assert.deepEqual(s.ledger.active, [50, 50]);
  for (const l of ls.filter((l) => l.index === 0).slice(0, 10)) l.release();
  assert.equal((await s.acquire(1)).index, 0);
  await s.close();
});

test('kv-predict: static placement until it has lengths, then predicted charges gate admission, longest first', async () => {
  const s = await Scheduler.create([echo('a', 10_000)], { pollMs: 0, policy: 'kv-predict' });
  const untrained = await Promise.all(Array.from({ length: 6 }, () => s.acquire(100 + 8000, undefined, 100)));
  assert.equal(s.waiting(), 0, 'no lengths yet: 6 worst-case budgets placed at once like the static split');
  for (const l of untrained) l.release();
  // a previous step where responses ran 1000–3000 tokens: ≈ 2000 + 100 prompt predicted each
  s.lengths.seed([1000, 2000, 3000]);
  s.lengths.record('long', 6000); // one finished sibling of prompt 'long' wrote 6000 tokens
  s.overcommit.value = 0;
  const held = await Promise.all(Array.from({ length: 4 }, () => s.acquire(8100, undefined, 100, 'short')));
  assert.ok(s.ledger.reserved[0] > 8000 && s.ledger.reserved[0] <= 10_000, `${s.ledger.reserved[0]} charged`);
  const order: string[] = [];
  const wait = (g: string) =>
    s.acquire(8100, undefined, 100, g).then((l) => {
      order.push(g);
      return l;
    });
  const waiting = [wait('short'), wait('long')];
  await tick();
  assert.equal(s.waiting(), 2, 'the predicted batch does not fit: the rest waits');
  for (const l of held) l.release();
  const rest = await Promise.all(waiting);
  assert.deepEqual(order, ['long', 'short'], 'predicted-longest first');
  for (const l of rest) l.release();
  await s.close();
});

test('kv-predict: a prompt its siblings hold on an engine is charged once; retractions before it placed anything leave the over-commit alone', async () => {
  const e = new FakeEngine(() => ({ outputIds: [1], retractions: 5 }), { name: 'a', capacityTokens: 1000 });
  const s = await Scheduler.create([e], { pollMs: 0, policy: 'kv-predict' });
  const first = await s.acquire(2000, undefined, 400, 'g');
  await first.generate([1, 2, 3], DEFAULT_SAMPLING);
  assert.equal(s.overcommit.value, 0.1, 'placed round-robin: its retractions say nothing of the prediction');
  first.release();
  s.lengths.seed([300]); // each sample: 400 prompt + 300 predicted
  s.overcommit.value = 0;
  const g = [await s.acquire(2000, undefined, 400, 'g'), await s.acquire(2000, undefined, 400, 'g')];
  assert.equal(s.ledger.reserved[0], 1000, '700 for the first, 300 for its sibling sharing the prompt');
  const other = s.acquire(2000, undefined, 400, 'h');
  await tick();
  assert.equal(s.waiting(), 1, "another prompt's 700 does not fit beside them");
  await g[0].generate([1, 2, 3], DEFAULT_SAMPLING);
  assert.ok(s.overcommit.value < 0, 'its own placement retracted: the over-commit shrinks');
  for (const l of g) l.release();
  (await other).release();
  await s.close();
});

test('LengthModel.promptShare: the between-prompt share of log-length variance (one-way ANOVA ICC)', () => {
  const share = (groups: number[][]) => {
    const m = new LengthModel(1 << 20);
    groups.forEach((g, i) => {
      for (const x of g) m.record(`p${i}`, x);
    });
    return m.promptShare();
  };
  assert.equal(share([[100, 200, 300]]), undefined, 'one prompt: nothing to compare');
  assert.equal(
    share([
      [100, 1000],
      [100, 1000],
      [100, 1000],
    ]),
    0,
    'same spread in every prompt',
  );
  const apart = share([
    [100, 110, 90],
    [1000, 1100, 900],
    [10_000, 11_000, 9000],
  ]) as number;
  assert.ok(apart > 0.99, `prompts far apart, samples close: ${apart}`);
  // recovers the share it was generated with (lognormal, as bench/scheduler-sim.ts draws lengths)
  const rng = new Rng(7);
  const normal = () =>
    Math.sqrt(-2 * Math.log(Math.max(rng.next(), 1e-12))) * Math.cos(2 * Math.PI * rng.next());
  for (const truth of [0.2, 0.5, 0.8]) {
    const groups = Array.from({ length: 256 }, () => {
      const mu = Math.log(2000) + 0.75 * Math.sqrt(truth) * normal();
      return Array.from({ length: 16 }, () =>
        Math.round(Math.exp(mu + 0.75 * Math.sqrt(1 - truth) * normal())),
      );
    });
    const est = share(groups) as number;
    assert.ok(Math.abs(est - truth) < 0.07, `generated with ${truth}, estimated ${est}`);
  }
});

test('LengthModel: conditional mean of the previous step, pulled to finished siblings; Overcommit adapts', () => {
  const m = new LengthModel(8192);
  assert.equal(m.predict(undefined, 0), 8192, 'no history: the whole budget');
  m.seed([100, 200, 300, 4000]);
  assert.equal(m.predict(undefined, 0), 1150);
  assert.equal(m.predict(undefined, 250), 2150, 'only lengths at least this long count');
  assert.equal(m.predict(undefined, 5000), 8192, 'longer than anything seen: the budget');
  assert.equal(
    m.predict('h', 0, [3500]),
    2100,
    'a sibling already past 3500 tokens raises its prompt’s estimate',
  );
  m.record('g', 300);
  m.record('g', 300);
  const pulled = m.predict('g', 0);
  assert.ok(pulled < 1150 && pulled > 300, `siblings pull the prediction down: ${pulled}`);
  m.nextStep();
  assert.equal(m.predict('g', 0), 300, "this step's lengths are the next prior; siblings are forgotten");
  const o = new Overcommit(0.1, -0.2, 0.5, 0.02);
  o.pressure(3);
  assert.ok(Math.abs(o.value - 0.04) < 1e-9);
  for (let i = 0; i < 1000; i++) o.clean();
  assert.equal(o.value, 0.5);
  o.pressure(100);
  assert.equal(o.value, -0.2);
  assert.equal(o.events, 103);
});

test('kv-predict runs a random multi-turn workload to the end: nothing stuck, charges within the over-commit', async () => {
  const rng = new Rng(11);
  const engines = ['a', 'b'].map(
    (name) =>
      new FakeEngine(
        async (_ids, s) => ({
          outputIds: Array(Math.min(s.maxNewTokens, rng.int(50, 400))).fill(1),
          delayMs: rng.int(0, 2),
        }),
        { name, capacityTokens: 6000 },
      ),
  );
  const s = await Scheduler.create(engines, { pollMs: 0, policy: 'kv-predict' });
  s.lengths.seed(Array.from({ length: 50 }, () => rng.int(100, 1200)));
  let worst = 0;
  let queued = 0;
  await Promise.all(
    Array.from({ length: 120 }, async (_, i) => {
      const group = `p${i % 12}`;
      const placed = s.acquire(100 + 1500, undefined, 100, group);
      queued = Math.max(queued, s.waiting());
      const l = await placed;
      for (let k = 0; k < 2; k++) {
        worst = Math.max(worst, ...s.ledger.reserved.map((r, j) => (s.ledger.active[j] > 1 ? r / 6000 : 0)));
        const r = await l.generate(Array(100 + k * 300).fill(2), {
          ...DEFAULT_SAMPLING,
          maxNewTokens: 700,
        });
        assert.equal(r.finishReason, 'stop');
      }
      l.release();
    }),
  );
  assert.ok(queued > 50, `admission gated the batch (${queued} waited at most)`);
  assert.equal(s.waiting(), 0);
  assert.deepEqual(s.ledger.active, [0, 0]);
  assert.ok(worst <= 1 + s.overcommit.max + 1e-9, `charged ${worst} × KV`);
  const stats = s.endRollout();
  assert.ok(stats.makespan_s > 0);
  assert.ok(s.lengths.trained);
  await s.close();
});
