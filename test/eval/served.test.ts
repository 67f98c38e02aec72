import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { Trajectory } from '../../src/agent/trajectory.js';
import { buildCharTokenizer, saveTokenizer, tokenizerFromFiles } from '../../src/tokenizer/index.js';
import { readJsonl } from '../../src/util/jsonl.js';

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
    const child = spawn(process.execPath, args, { env: { ...process.env, RSTAR2_NO_PROGRESS: '1' } });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c) => (stdout += c));
    child.stderr.on('data', (c) => (stderr += c));
    const code = await new Promise<number | null>((ok) => child.once('exit', ok));
    assert.equal(code, 0, stderr);
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
