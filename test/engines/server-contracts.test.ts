import assert from 'node:assert/strict';
import { test } from 'node:test';
import { SGLangEngine } from '../../src/engines/sglang.js';
import { DEFAULT_SAMPLING, type SamplingParams } from '../../src/engines/types.js';
import { checkVersion } from '../../src/engines/version.js';
import { parseVllm, VllmEngine } from '../../src/engines/vllm.js';
import { fakeServer, GEN_PATH, OUT } from './fake-servers.js';
import { SGLANG_05, SGLANG_MAIN, SGLANG_OLD, VLLM_0102, VLLM_MAIN, VLLM_RELEASE } from './server-specs.js';

// The clients against fakes held to each server version's published contract (server-specs.ts): routes one
// version has and another lacks, what each refuses, and what each says about itself (issue 40).

const S: SamplingParams = { ...DEFAULT_SAMPLING, maxNewTokens: 8, temperature: 0.7 };
const FAST = { timeoutMs: 2000, retries: 0 };

async function post(url: string, body: unknown): Promise<{ status: number; text: string }> {
  const r = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: r.status, text: await r.text() };
}

for (const spec of [SGLANG_MAIN, SGLANG_05]) {
  test(`${spec.label}: context, KV pool, load and version come from the routes it serves`, async () => {
    const f = await fakeServer('sglang', spec);
    const lines: string[] = [];
    try {
      const e = new SGLangEngine(f.url, { ...FAST, log: (l) => lines.push(l) });
      assert.deepEqual(await e.generate([1, 2, 3], S), {
        outputIds: OUT,
        logprobs: [-0.1, -0.2, -0.3],
        finishReason: 'stop',
      });
      for (const dp of [1, 2] as const) {
        f.dp = dp;
        const load = await e.load();
        assert.equal(load.capacityTokens, 123456);
        assert.equal(load.blockTokens, 16);
        // 0.5.3's /get_load rows and main's /v1/loads both carry tokens, running and waiting requests per DP rank
        assert.deepEqual([load.usedTokens, load.running, load.queued], [1500, 3, 1]);
      }
      const r = await e.describe();
      assert.equal(r.version, spec.version);
      assert.equal(r.kv.capacityTokens, 123456);
      // main: its deprecated routes are never asked; 0.5.3: the routes it lacks are asked once, never again
      const asked = (p: string) => f.requests.filter((q) => q.path === p).length;
      if (spec === SGLANG_MAIN) assert.deepEqual([asked('/get_server_info'), asked('/get_load')], [0, 0]);
      else assert.deepEqual([asked('/server_info'), asked('/v1/loads?include=core')], [1, 1]);
      assert.deepEqual(lines, []);
    } finally {
      await f.close();
    }
  });

  test(`${spec.label}: every sampling key the client sends is one SamplingParams takes`, async () => {
    const f = await fakeServer('sglang', spec);
    f.deterministic = true;
    try {
      const e = new SGLangEngine(f.url, FAST);
      const all = {
        ...S,
        seed: 7,
        ignoreEos: true,
        stopStrings: ['\n'],
        stopTokenIds: [5],
        topK: 20,
        topP: 0.9,
      };
      const r = await e.generate([1, 2, 3], all);
      assert.equal(r.finishReason, 'length', r.error);
      // the fake is as strict as the server: any other key is an HTTP 500
      const bad = await post(`${f.url}/generate`, {
        input_ids: [1],
        sampling_params: { max_new_tokens: 2, seed: 1 },
      });
      assert.equal(bad.status, 500);
    } finally {
      await f.close();
    }
  });
}

test('SGLang older than 0.5.3 is refused at its first use, naming its version', async () => {
  const f = await fakeServer('sglang', SGLANG_OLD);
  try {
    const e = new SGLangEngine(f.url, FAST);
    const r = await e.generate([1, 2, 3], { ...S, seed: 3 });
    assert.equal(r.finishReason, 'error');
    assert.match(r.error ?? '', /sglang 0\.4\.8 is older than 0\.5\.3, the oldest rstar2 supports/);
    assert.equal(f.requests.filter((q) => q.path === GEN_PATH.sglang).length, 0);
    await assert.rejects(e.describe(), /0\.4\.8 is older than 0\.5\.3/);
    await assert.rejects(e.weightGroupRanks(), /0\.4\.8 is older than 0\.5\.3/);
    // its /get_load is {load}, rank 0's tokens alone
    assert.deepEqual(await (await fetch(`${f.url}/get_load`)).json(), { load: 1500 });
    // what that build does with what newer clients send: sampling_seed is an HTTP 500, plural names a 400
    const seeded = await post(`${f.url}/generate`, {
      input_ids: [1],
      sampling_params: { max_new_tokens: 2, sampling_seed: 1 },
    });
    assert.equal(seeded.status, 500);
    const plural = await post(`${f.url}/update_weights_from_distributed`, {
      names: ['a'],
      dtypes: ['bfloat16'],
      shapes: [[1]],
    });
    assert.equal(plural.status, 400);
  } finally {
    await f.close();
  }
});

test('SGLang without --enable-deterministic-inference: a seeded request warns once that seeds are ignored', async () => {
  const f = await fakeServer('sglang');
  const lines: string[] = [];
  try {
    const e = new SGLangEngine(f.url, { ...FAST, log: (l) => lines.push(l) });
    await e.generate([1, 2], S); // no seed, no warning
    assert.deepEqual(lines, []);
    const one = await e.generate([1, 2], { ...S, seed: 1 });
    const two = await e.generate([1, 2], { ...S, seed: 2 });
    assert.deepEqual(one.outputIds, two.outputIds); // the seed changes nothing there
    assert.equal(lines.length, 1);
    assert.match(
      lines[0],
      /^warning: sglang:.* ignores sampling_seed \(started without --enable-deterministic-inference\)/,
    );
    const r = await e.describe();
    assert.equal(r.seeds, false);
    assert.ok(r.notes.some((n) => /ignores sampling_seed/.test(n)));

    f.deterministic = true;
    const quiet: string[] = [];
    const d = new SGLangEngine(f.url, { ...FAST, log: (l) => quiet.push(l) });
    // there the seed decides the sample: the same again for its seed, another for another seed
    const [a, b, c] = [1, 1, 2].map((seed) => d.generate([1, 2], { ...S, seed }));
    assert.deepEqual((await a).outputIds, (await b).outputIds);
    assert.notDeepEqual((await a).outputIds, (await c).outputIds);
    assert.deepEqual(quiet, []);
    assert.equal((await d.describe()).seeds, true);
  } finally {
    await f.close();
  }
});

test('vLLM: a temperature above 2 is refused before it is sent, as vLLM main refuses it', async () => {
  const f = await fakeServer('vllm');
  try {
    const e = new VllmEngine(f.url, FAST);
    const r = await e.generate([1, 2, 3], { ...S, temperature: 2.5 });
    assert.equal(r.finishReason, 'error');
    assert.match(r.error ?? '', /temperature 2\.5 is above 2, which vLLM refuses/);
    assert.equal(f.requests.filter((q) => q.path === GEN_PATH.vllm).length, 0);
    assert.equal((await e.generate([1, 2, 3], { ...S, temperature: 2 })).finishReason, 'stop');
    // the fake refuses as main does; the release before the bound takes it
    const raw = { model: 'tiny-model', prompt: [1], max_tokens: 2, temperature: 2.5 };
    assert.equal((await post(`${f.url}/v1/completions`, raw)).status, 400);
    const old = await fakeServer('vllm', VLLM_RELEASE);
    try {
      assert.equal((await post(`${old.url}/v1/completions`, raw)).status, 200);
    } finally {
      await old.close();
    }
  } finally {
    await f.close();
  }
});

test('vLLM: the fake returns only what a request asked for, and the client asks for what it reads', async () => {
  const f = await fakeServer('vllm');
  try {
    const bare = JSON.parse(
      (await post(`${f.url}/v1/completions`, { model: 'tiny-model', prompt: [1], max_tokens: 3 })).text,
    );
    // model_dump(): what was not asked for is null, not absent
    assert.deepEqual([bare.choices[0].token_ids, bare.choices[0].prompt_token_ids], [null, null]);
    assert.equal(bare.choices[0].logprobs, null);
    const text = JSON.parse(
      (
        await post(`${f.url}/v1/completions`, {
          model: 'tiny-model',
          prompt: [1],
          max_tokens: 3,
          logprobs: 0,
        })
      ).text,
    );
    assert.ok(!String(text.choices[0].logprobs.tokens[0]).startsWith('token_id:'));
    // logprobs 0: each position's top_logprobs holds the sampled token alone
    assert.deepEqual(text.choices[0].logprobs.top_logprobs[0], {
      [text.choices[0].logprobs.tokens[0]]: -0.1,
    });
    const e = new VllmEngine(f.url, FAST);
    assert.deepEqual((await e.generate([1, 2], S)).outputIds, OUT);
    // ids from token_id:N logprob tokens where token_ids is null (a server that ignores return_token_ids)
    const sent = f.requests.at(-1)?.body ?? {};
    const noIds = JSON.parse(
      (await post(`${f.url}/v1/completions`, { ...sent, return_token_ids: false })).text,
    );
    assert.equal(noIds.choices[0].token_ids, null);
    assert.deepEqual(parseVllm(noIds.choices[0]).outputIds, OUT);
  } finally {
    await f.close();
  }
});

test('vLLM: version, dtype and --logprobs-mode read in dev mode; without it a note, and no weight sync', async () => {
  const f = await fakeServer('vllm');
  try {
    const r = await new VllmEngine(f.url, FAST).describe();
    assert.equal(r.version, VLLM_MAIN.version);
    assert.equal(r.dtype, 'bfloat16');
    assert.equal(r.logprobsMode, 'raw_logprobs');
    assert.equal(r.maxTemperature, 2);
    assert.ok(
      r.notes.some((n) => /--logprobs-mode raw_logprobs: .*--logprobs-mode processed_logprobs/.test(n)),
    );
    f.logprobsMode = 'processed_logprobs';
    const p = await new VllmEngine(f.url, FAST).describe();
    assert.equal(p.logprobsMode, 'processed_logprobs');
    assert.deepEqual(p.notes, []);

    f.devMode = false;
    const e = new VllmEngine(f.url, FAST);
    const d = await e.describe();
    assert.equal(d.logprobsMode, undefined);
    assert.ok(d.notes.some((n) => /no \/server_info \(VLLM_SERVER_DEV_MODE=1 serves it\)/.test(n)));
    await assert.rejects(e.weightGroupRanks(), /VLLM_SERVER_DEV_MODE=1/);
  } finally {
    await f.close();
  }
});

test('vLLM 0.10.2: /server_info is text only, so the dtype is read from it and the logprobs mode is not', async () => {
  const f = await fakeServer('vllm', VLLM_0102);
  try {
    const r = await new VllmEngine(f.url, FAST).describe();
    assert.equal(r.version, '0.10.2');
    assert.equal(r.dtype, 'bfloat16');
    assert.equal(r.logprobsMode, undefined);
    assert.ok(
      r.notes.some((n) =>
        /no config_format=json \(vLLM before 0\.11\.0\): its --logprobs-mode cannot be read/.test(n),
      ),
      r.notes.join('\n'),
    );
    assert.ok(!r.notes.some((n) => /VLLM_SERVER_DEV_MODE/.test(n)));
  } finally {
    await f.close();
  }
});

test('versions as the builds write them: pre-releases of the minimum are older, untagged builds only noted', () => {
  // SGLang v0.5.3rc0 and rc1 report '0.5.3rc0' and lack sampling_seed; PEP 440 puts any rc below the release
  assert.throws(() => checkVersion('s', 'sglang', '0.5.3rc0'), /sglang 0\.5\.3rc0 is older than 0\.5\.3/);
  assert.throws(() => checkVersion('v', 'vllm', '0.10.2rc1'), /vllm 0\.10\.2rc1 is older than 0\.10\.2/);
  for (const v of ['0.5.3', '0.5.3.post1', SGLANG_MAIN.version, '0.5.10+cu130'])
    assert.equal(checkVersion('s', 'sglang', v), undefined, v);
  for (const v of ['0.10.2', VLLM_MAIN.version, '0.11.0+precompiled'])
    assert.equal(checkVersion('v', 'vllm', v), undefined, v);
  // SGLang from 0.5.7 reports '0.0.0.dev0' without git metadata: not a 0.0.0 to refuse
  assert.match(checkVersion('s', 'sglang', '0.0.0.dev0') ?? '', /cannot tell what sglang '0\.0\.0\.dev0' is/);
  assert.match(checkVersion('v', 'vllm', 'dev') ?? '', /cannot tell what vllm 'dev' is/);
});

test('vLLM older than 0.10.2 is refused, naming its version; a build without tags is only noted', async () => {
  const f = await fakeServer('vllm', { ...VLLM_RELEASE, version: '0.9.2' });
  try {
    const r = await new VllmEngine(f.url, FAST).generate([1, 2], S);
    assert.equal(r.finishReason, 'error');
    assert.match(r.error ?? '', /vllm 0\.9\.2 is older than 0\.10\.2, the oldest rstar2 supports/);
    f.spec = { ...VLLM_MAIN, version: '0.1.dev20073+g8e685d198' };
    const lines: string[] = [];
    const e = new VllmEngine(f.url, { ...FAST, log: (l) => lines.push(l) });
    assert.equal((await e.generate([1, 2], S)).finishReason, 'stop');
    assert.match(
      lines.join('\n'),
      /cannot tell what vllm '0\.1\.dev20073\+g8e685d198' is \(a source build\?\)/,
    );
  } finally {
    await f.close();
  }
});
