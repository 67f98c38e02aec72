import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { runTrajectory } from '../../src/agent/loop.js';
import { HttpClient, HttpError } from '../../src/engines/http.js';
import { Scheduler } from '../../src/engines/scheduler.js';
import { SGLangEngine } from '../../src/engines/sglang.js';
import { DEFAULT_SAMPLING, type Engine } from '../../src/engines/types.js';
import { VllmEngine } from '../../src/engines/vllm.js';
import { failureOf } from '../../src/rl/trajectory.js';
import { CALL, encode, FakeRunner, template } from '../agent/helpers.js';
import { type Fake, fakeServer, GEN_PATH, OUT } from './fake-servers.js';

// Requests are capped to the model's context as each server publishes it, so a trajectory whose prompt grows with
// every tool turn ends at the context with finish 'length' instead of a refused request (an engine error).

type Api = 'sglang' | 'vllm';
const FAST = { timeoutMs: 2000, retries: 1, backoffMs: 5 };
// SGLang keeps one token spare (older builds refuse prompt + max_new_tokens == context); vLLM takes the context whole
const SPARE: Record<Api, number> = { sglang: 1, vllm: 0 };
const TURN = `x${CALL}<|im_end|>`; // the fake model calls the tool every turn
const QUESTION = 'What is 1+1?';
const TOOL_TEXT = '2';

function engine(api: Api, f: Fake, log?: (l: string) => void): Engine {
  return api === 'sglang'
    ? new SGLangEngine(f.url, { ...FAST, log })
    : new VllmEngine(f.url, { ...FAST, log });
}

const sent = (api: Api, f: Fake) =>
  f.requests
    .filter((q) => q.path === GEN_PATH[api])
    .map((q) =>
      api === 'sglang'
        ? (q.body.sampling_params as Record<string, number>).max_new_tokens
        : q.body.max_tokens,
    );

async function trajectory(api: Api, f: Fake, promptIds?: number[]) {
  f.sample = () => encode(TURN);
  const s = await Scheduler.create([engine(api, f)], { pollMs: 0 });
  const t = await runTrajectory({ id: 'p', question: QUESTION, promptIds }, 0, s, {
    template,
    runner: new FakeRunner(),
    executeTool: async () => ({ text: TOOL_TEXT, error: false }),
    maxResponseTokens: 8192, // more than the context: the context binds
  });
  await s.close();
  return t;
}

const P = template.promptIds(QUESTION).length;
const G = encode(TURN).length;
const T = template.toolTurnIds([TOOL_TEXT]).length;

for (const api of ['sglang', 'vllm'] as Api[]) {
  test(`${api}: without the cap the fake refuses as the server does (HTTP 400 and its message)`, async () => {
    const f = await fakeServer(api);
    try {
      f.context = 100;
      const http = new HttpClient(f.url, { retries: 0 });
      const prompt = Array(60).fill(7);
      const body =
        api === 'sglang'
          ? { input_ids: prompt, sampling_params: { max_new_tokens: 40 } }
          : { model: 'tiny-model', prompt, max_tokens: 41 };
      const err = await http.json('POST', GEN_PATH[api], body).catch((e: unknown) => e);
      assert.ok(err instanceof HttpError && err.status === 400, String(err));
      const text =
        api === 'sglang'
          ? "Requested token count exceeds the model's maximum context length of 100 tokens. You requested a total of 100"
          : "'max_tokens' or 'max_completion_tokens' is too large: 41. This model's maximum context length is 100";
      assert.ok(err.message.includes(text), err.message);
      const models = await http.json<{ data: { max_model_len: number }[] }>('GET', '/v1/models');
      assert.equal(models.data[0].max_model_len, 100);
    } finally {
      await f.close();
    }
  });

  test(`${api}: a trajectory whose prompt grows to the context ends 'length', each request capped exactly`, async () => {
    const f = await fakeServer(api);
    try {
      f.context = P + G + T + 20; // the second turn has room for 20 tokens (less SGLang's spare one)
      const t = await trajectory(api, f);
      assert.equal(t.finish, 'length', t.error);
      assert.equal(
        failureOf(t),
        undefined,
        'out of context is the model’s length, not an infrastructure failure',
      );
      assert.equal(t.events.filter((e) => e.kind === 'error').length, 0, 'no request was refused');
      assert.deepEqual(sent(api, f), [f.context - SPARE[api] - P, f.context - SPARE[api] - (P + G + T)]);
      const last = t.events.filter((e) => e.kind === 'generation').at(-1);
      assert.ok(last?.kind === 'generation' && last.finishReason === 'length' && last.end > last.start);
      assert.ok(P + t.responseIds.length <= f.context);
      assert.equal(t.responseMask.at(-1), 1);
    } finally {
      await f.close();
    }
  });

  test(`${api}: a prompt that fills the context is not sent; the trajectory ends 'length'`, async () => {
    const f = await fakeServer(api);
    try {
      f.context = 300;
      const e = engine(api, f);
      const S = { ...DEFAULT_SAMPLING, maxNewTokens: 16 };
      // SGLang's scheduler takes prompts below max_req_input_len (context − 6); vLLM's whole context less one token
      const full = api === 'sglang' ? 300 - 6 : 300;
      assert.deepEqual(await e.generate(Array(full).fill(7), S), {
        outputIds: [],
        logprobs: [],
        finishReason: 'length',
      });
      assert.deepEqual(sent(api, f), [], 'not sent');
      const r = await e.generate(Array(full - 1).fill(7), S);
      assert.equal(r.finishReason, api === 'sglang' ? 'stop' : 'length', r.error);
      assert.deepEqual(
        sent(api, f),
        [api === 'sglang' ? 6 : 1],
        'one token shorter: sent with what room is left',
      );
      const t = await trajectory(api, f, Array(full).fill(7));
      assert.equal(t.finish, 'length', t.error);
      assert.deepEqual(t.responseIds, []);
      assert.equal(failureOf(t), undefined);
      assert.equal(sent(api, f).length, 1, 'the trajectory sent nothing');
    } finally {
      await f.close();
    }
  });

  test(`${api}: a tool turn that fills the context is taken back: finish tool_overflow on the model's tokens`, async () => {
    const f = await fakeServer(api);
    try {
      f.context = P + G + T + SPARE[api]; // after the tool turn no room for one token
      const t = await trajectory(api, f);
      assert.equal(t.finish, 'tool_overflow', t.error);
      assert.equal(failureOf(t), undefined);
      assert.deepEqual(t.responseIds, encode(TURN), 'the tool turn is not kept');
      assert.equal(t.responseMask.at(-1), 1);
      assert.equal(t.responseLogprobs.length, G);
      const r = t.events.find((e) => e.kind === 'tool_result');
      assert.ok(r?.kind === 'tool_result' && r.start === G && r.end === G);
      assert.equal(sent(api, f).length, 1);
    } finally {
      await f.close();
    }
  });

  test(`${api}: a server that publishes no context length gets requests as before, logged once`, async () => {
    const f = await fakeServer(api);
    try {
      f.publishesContext = false;
      const lines: string[] = [];
      const e = engine(api, f, (l) => lines.push(l));
      const S = { ...DEFAULT_SAMPLING, maxNewTokens: 16 };
      for (let i = 0; i < 3; i++) assert.deepEqual((await e.generate([1, 2, 3], S)).outputIds, OUT);
      assert.deepEqual(sent(api, f), [16, 16, 16]);
      assert.equal(lines.length, 1);
      assert.match(lines[0], /publishes no context length/);
    } finally {
      await f.close();
    }
  });
}

test("a caller's abort while the context length is being read answers at once, as 'abort'", async () => {
  // a server that takes requests but never answers them (busy starting, or loading weights)
  const srv = createServer(() => {});
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
  const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
  try {
    for (const e of [
      new SGLangEngine(url, { timeoutMs: 20_000 }),
      new VllmEngine(url, { timeoutMs: 20_000 }),
    ]) {
      const ac = new AbortController();
      setTimeout(() => ac.abort(), 100);
      const t0 = Date.now();
      const r = await e.generate([1, 2, 3], { ...DEFAULT_SAMPLING, maxNewTokens: 8 }, ac.signal);
      assert.equal(r.finishReason, 'abort', r.error);
      assert.ok(Date.now() - t0 < 2000, `${e.name}: answered after ${Date.now() - t0} ms`);
    }
  } finally {
    srv.closeAllConnections();
    srv.close();
  }
});

test("vllm: a LoRA adapter's requests are capped to its base model's context", async () => {
  const f = await fakeServer('vllm');
  try {
    f.context = 100;
    f.lora = 'adapter';
    const e = new VllmEngine(f.url, { ...FAST, model: 'adapter' });
    const r = await e.generate(Array(90).fill(7), { ...DEFAULT_SAMPLING, maxNewTokens: 64 });
    assert.equal(r.error, undefined);
    assert.deepEqual(sent('vllm', f), [10]);
    assert.equal(f.requests.find((q) => q.path === GEN_PATH.vllm)?.body.model, 'adapter');
  } finally {
    await f.close();
  }
});

test('sglang: speculative draft tokens count into the prompt, so they are kept spare too', async () => {
  const f = await fakeServer('sglang');
  try {
    f.context = 200;
    f.draftTokens = 4;
    const r = await engine('sglang', f).generate(Array(100).fill(7), {
      ...DEFAULT_SAMPLING,
      maxNewTokens: 500,
    });
    assert.equal(r.finishReason, 'stop', r.error);
    assert.deepEqual(sent('sglang', f), [200 - 1 - 4 - 100]);
  } finally {
    await f.close();
  }
});
