import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { openPolicy } from '../../src/eval/policy.js';
import { runEval } from '../../src/eval/run.js';
import { fallbackVerify } from '../../src/eval/verify.js';
import type { Trajectory } from '../../src/rl/trajectory.js';
import { buildCharTokenizer, saveTokenizer, tokenizerFromFiles } from '../../src/tokenizer/index.js';
import { readJsonl } from '../../src/util/jsonl.js';
import { pythonThenAnswer } from '../agent/helpers.js';

// `rstar2 eval` end to end against a served engine: a stand-in SGLang server (its native /generate
// API, token ids in and out) whose "model" calls the python tool once and answers with what it
// printed; tool calls run in the real sandbox; answers are checked by the reward verifier.
const skip = existsSync('/usr/bin/bwrap') ? false : 'bubblewrap not installed';

test('eval over a served SGLang-API engine with real tool calls', { skip, timeout: 120_000 }, async () => {
  const d = mkdtempSync(join(tmpdir(), 'rstar2-served-'));
  const files = buildCharTokenizer();
  saveTokenizer(files, join(d, 'tok'));
  const tok = tokenizerFromFiles(files);
  const call = (expr: string) =>
    `<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(${expr})", "input": ""}}\n</tool_call><|im_end|>`;
  const seen: number[] = [];
  const server = createServer((req, res) => {
    let raw = '';
    req.on('data', (c) => (raw += c));
    req.on('end', () => {
      const json = (o: unknown) => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify(o));
      };
      if (req.url === '/get_server_info')
        return json({ max_total_num_tokens: 1 << 20, internal_states: [{}] });
      if (req.url?.startsWith('/v1/loads')) return json({ loads: [] });
      if (req.url !== '/generate') {
        res.writeHead(404).end();
        return;
      }
      const body = JSON.parse(raw) as { input_ids: number[] };
      seen.push(body.input_ids.length);
      const prompt = tok.decode(body.input_ids);
      const printed = /stdout: (\d+)/.exec(prompt);
      const q = /What is (\d+)\*(\d+)\?/.exec(prompt);
      const text = printed
        ? `<answer>\\boxed{${printed[1]}}</answer><|im_end|>`
        : `Let me compute.\n${call(q ? `${q[1]}*${q[2]}` : '0')}`;
      const ids = tok.encode(text, { addSpecialTokens: false });
      json({
        text,
        output_ids: ids,
        meta_info: {
          output_token_logprobs: ids.map((id) => [-0.1, id, null]),
          finish_reason: { type: 'stop', matched: ids[ids.length - 1] },
        },
      });
    });
  });
  await new Promise<void>((ok) => server.listen(0, '127.0.0.1', ok));
  const port = (server.address() as AddressInfo).port;
  try {
    const data = join(d, 'mul.jsonl');
    const rows = [
      { id: 'm1', problem: 'What is 6*7?', answer: '42' },
      { id: 'm2', problem: 'What is 12*12?', answer: '144' },
    ];
    writeFileSync(data, rows.map((r) => JSON.stringify(r)).join('\n'));
    const out = join(d, 'ev');
    const args = [
      'bin/rstar2.js',
      'eval',
      '--engine',
      `sglang+http://127.0.0.1:${port}`,
      '--tokenizer',
      join(d, 'tok'),
    ];
    args.push('--data', data, '--samples', '2', '--out', out, '--max-response-tokens', '4096');
    const { status, stdout, stderr } = await cli(args);
    assert.equal(status, 0, stderr);
    assert.match(
      stdout,
      /mul: avg@2 100\.0% {2}pass@2 100\.0% {2}maj@2 100\.0% {2}tokens \d+ {2}tool calls 1\.00/,
    );
    const ts = readJsonl<Trajectory>(join(out, 'trajectories.jsonl'));
    assert.equal(ts.length, 4);
    for (const t of ts) {
      assert.equal(t.finish, 'answered', t.error);
      assert.equal(t.correct, true);
      const result = t.events.find((e) => e.kind === 'tool_result');
      assert.ok(
        result && result.kind === 'tool_result' && /stdout: (42|144)/.test(result.text),
        JSON.stringify(result),
      );
      assert.ok(t.responseMask.includes(0) && t.responseMask.includes(1)); // observation masked, generation trained
    }
    const report = JSON.parse(readFileSync(join(out, 'report.json'), 'utf8'));
    assert.equal(report.toolErrorRate, 0);
    assert.ok(seen.length >= 8); // two generate calls per trajectory
  } finally {
    server.close();
  }
});

// Not spawnSync: the stand-in server answers from this process's event loop.
async function cli(args: string[]) {
  const child = spawn(process.execPath, args, { env: { ...process.env, RSTAR2_NO_PROGRESS: '1' } });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c) => (stdout += c));
  child.stderr.on('data', (c) => (stderr += c));
  const status = await new Promise<number | null>((ok) => child.once('exit', ok));
  return { status, stdout, stderr };
}

// A stand-in SGLang server whose model answers every prompt with `ids()`.
async function idServer(ids: () => number[]) {
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const json = (o: unknown) =>
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(o));
      if (req.url === '/get_server_info')
        return json({ max_total_num_tokens: 1 << 20, internal_states: [{}] });
      if (req.url?.startsWith('/v1/loads')) return json({ loads: [] });
      if (req.url !== '/generate') return void res.writeHead(404).end(); // as SGLang answers a route it lacks
      const out = ids();
      json({
        output_ids: out,
        meta_info: {
          output_token_logprobs: out.map((id) => [-0.1, id, null]),
          finish_reason: { type: 'stop', matched: out[out.length - 1] },
        },
      });
    });
  });
  await new Promise<void>((ok) => server.listen(0, '127.0.0.1', ok));
  return { server, url: `sglang+http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

test('CLI: an eval whose samples all fail exits non-zero naming the error, and a resume regenerates them', {
  timeout: 60_000,
}, async () => {
  const d = mkdtempSync(join(tmpdir(), 'rstar2-served-'));
  const files = buildCharTokenizer();
  saveTokenizer(files, join(d, 'tok'));
  const tok = tokenizerFromFiles(files);
  let mismatched = true; // a model whose ids the tokenizer does not have
  const { server, url } = await idServer(() =>
    mismatched
      ? [tok.vocabSize + 7]
      : tok.encode('<answer>\\boxed{42}</answer><|im_end|>', { addSpecialTokens: false }),
  );
  try {
    const data = join(d, 'q.jsonl');
    writeFileSync(data, `${JSON.stringify({ id: 'q1', problem: 'What is 6*7?', answer: '42' })}\n`);
    const args = ['bin/rstar2.js', 'eval', '--engine', url, '--tokenizer', join(d, 'tok'), '--data', data];
    args.push('--samples', '2', '--out', join(d, 'ev'));
    const bad = await cli(args);
    assert.notEqual(bad.status, 0);
    assert.doesNotMatch(bad.stdout, /avg@2/);
    assert.match(
      bad.stderr,
      /eval INCOMPLETE: 2 samples failed for infrastructure reasons \(first: .*cannot decode response.*\) and are left out of the scores; fix the cause and re-run the same command/,
    );
    const report = JSON.parse(readFileSync(join(d, 'ev', 'report.json'), 'utf8'));
    assert.equal(report.samples, 0);
    assert.equal(report.failed, 2);
    mismatched = false;
    const good = await cli(args);
    assert.equal(good.status, 0, good.stderr);
    assert.match(good.stdout, /q: avg@2 100\.0% .*\(1 problems, 2 samples, /);
  } finally {
    server.close();
  }
});

test('a sandbox that cannot be reached fails samples instead of scoring them wrong; a resume regenerates them', {
  timeout: 120_000,
}, async () => {
  const tok = tokenizerFromFiles(buildCharTokenizer());
  const engine = pythonThenAnswer(tok, (p) => `<answer>\\boxed{${p ?? 'none'}}</answer><|im_end|>`);
  const out = mkdtempSync(join(tmpdir(), 'rstar2-nosandbox-'));
  const evalWith = async (sandbox: string) => {
    const policy = await openPolicy({
      engineInstance: engine,
      tokenizerInstance: tok,
      sandbox,
      temperature: 0.6,
      topP: 1,
      maxTokens: 4096,
      concurrency: 2,
    });
    try {
      return await runEval({
        outDir: out,
        config: {
          bench: 'q',
          dataFile: '/q',
          k: 2,
          temperature: 0.6,
          topP: 1,
          seed: 0,
          engine: policy.name,
        },
        problems: [{ id: 'q1', problem: 'What is 6*7?', answer: '42' }],
        rollout: policy.rollout,
        verify: fallbackVerify,
        progress: false,
        log: () => {},
      });
    } finally {
      await policy.close();
    }
  };
  const down = await evalWith('http://127.0.0.1:1');
  assert.equal(down.samples, 0);
  assert.equal(down.failed, 2);
  assert.match(
    down.failure ?? '',
    /^sandbox internal_error: cannot reach sandbox service at http:\/\/127\.0\.0\.1:1/,
  );
  if (skip) return; // no local sandbox to resume with
  const up = await evalWith('embedded');
  assert.equal(up.failed, 0);
  assert.equal(up.avgAtK, 1);
});
