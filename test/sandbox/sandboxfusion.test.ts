// SandboxFusion's POST /run_code, as verl's sandbox tool and reward code call it. Request bodies are
// built exactly as verl builds them and responses are checked field by field against SandboxFusion's
// RunCodeResponse (bytedance/SandboxFusion sandbox/server/sandbox_api.py, sandbox/runners/types.py).
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { findBwrap } from '../../src/sandbox/isolation.js';
import { SandboxPool } from '../../src/sandbox/pool.js';
import { SandboxServer, type SandboxServerOptions } from '../../src/sandbox/server.js';
import type { RunRequest, RunResult } from '../../src/sandbox/types.js';
import { failedResult } from '../../src/sandbox/types.js';
import { FakeRunner, okResult, SpawnRunner } from './helpers.js';

const servers: SandboxServer[] = [];
const cleanup: Array<() => Promise<void>> = [];
after(async () => {
  for (const s of servers) await s.close();
  for (const f of cleanup) await f();
});

async function start(opts: Partial<SandboxServerOptions> = {}) {
  const s = new SandboxServer({ runner: new SpawnRunner(), port: 0, log: () => {}, podName: null, ...opts });
  servers.push(s);
  const { url } = await s.listen();
  return { s, url };
}

/** verl's request: the exact payload of call_sandbox_api in volcengine/verl
 * verl/utils/reward_score/sandbox_fusion/utils.py (commit b178a3cd, 2026-01), same key order, sent
 * with `data=json.dumps(payload)` and these headers. The tool (verl/tools/sandbox_fusion_tools.py,
 * SandboxFusionTool.execute_code) passes stdin None, compile_timeout = run_timeout = its timeout
 * (default_timeout 30) and memory_limit_mb (default 1024). */
function verlPayload(o: {
  code: string;
  stdin?: string | null;
  timeout?: number;
  memoryLimitMb?: number;
  language?: string;
}): string {
  const timeout = o.timeout ?? 30;
  return JSON.stringify({
    compile_timeout: timeout,
    run_timeout: timeout,
    code: o.code,
    stdin: o.stdin ?? null,
    memory_limit_MB: o.memoryLimitMb ?? 1024,
    language: o.language ?? 'python',
    files: {},
    fetch_files: [],
  });
}

async function postRaw(url: string, body: string, headers: Record<string, string> = {}) {
  const res = await fetch(`${url}/run_code`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json', ...headers },
    body,
  });
  return { status: res.status, body: (await res.json()) as any, headers: res.headers };
}

/** What verl makes of an answer: _process_single_case's status classification and result code
 * (verl/utils/reward_score/sandbox_fusion/utils.py), and the text SandboxFusionTool gives the model. */
function verlView(resp: any): { status: string; code: number | boolean; toolText: string } {
  const run = resp.run_result;
  const compile = resp.compile_result;
  let status = 'unknown';
  let code: number | boolean = -1;
  if (resp.status === 'SandboxError') status = 'sandbox_error';
  else if (resp.status === 'Failed') {
    if (compile && (compile.status !== 'Finished' || compile.return_code !== 0)) {
      status = compile.status === 'TimeLimitExceeded' ? 'compile_timeout' : 'compile_error';
      code = -4;
    } else if (run) {
      if (run.status === 'TimeLimitExceeded') [status, code] = ['timeout', -3];
      else if (run.status === 'Error' || (run.status === 'Finished' && run.return_code !== 0))
        [status, code] = ['runtime_error', -2];
      else status = 'unknown_failure';
    } else status = 'unknown_failure_state';
  } else if (resp.status === 'Success') {
    if (run && run.status === 'Finished') [status, code] = ['success', true];
    else status = 'unexpected_success_state';
  }
  const toolText = run?.status === 'Finished' ? run.stdout + run.stderr : 'no stdout here';
  return { status, code, toolText };
}

const RESPONSE_KEYS = ['status', 'message', 'compile_result', 'run_result', 'executor_pod_name', 'files'];
const RUN_RESULT_KEYS = ['status', 'execution_time', 'return_code', 'stdout', 'stderr'];

function result(over: Partial<RunResult>): RunResult {
  return { ...okResult({ code: '' }), stdout: '', ...over };
}

test('verl tool request: translated to a native request (timeouts, memory, stdin, files)', async () => {
  const runner = new FakeRunner();
  const { url } = await start({ runner, memoryMb: 2048 });
  const a = await postRaw(url, verlPayload({ code: 'print(1)' }));
  assert.equal(a.status, 200);
  // reward path: stdin is the test input, timeout the case timeout (DEFAULT_TIMEOUT 10)
  await postRaw(url, verlPayload({ code: 'print(input())', stdin: '3 4', timeout: 10, memoryLimitMb: 512 }));
  // SandboxFusion's own defaults for omitted fields: run_timeout 10, memory_limit_MB -1 (none here:
  // the service default applies), files {}, fetch_files []; null file contents are skipped
  await postRaw(
    url,
    JSON.stringify({
      code: 'x',
      language: 'python',
      run_timeout: 1.5,
      files: { 'a.txt': 'aGk=', 'skip.txt': null },
      fetch_files: ['out.txt'],
      args: ['ignored like pydantic ignores unknown fields'],
    }),
  );
  await postRaw(url, JSON.stringify({ code: 'y', language: 'python' }));
  // numbers written as strings, which pydantic's lax mode takes
  await postRaw(
    url,
    JSON.stringify({ code: 'z', language: 'python', run_timeout: '5', memory_limit_MB: '256' }),
  );
  const seen = runner.seen.map(({ queueTimeoutMs: _q, ...r }: RunRequest) => r);
  assert.deepEqual(seen, [
    { memoryMb: 1024, code: 'print(1)', timeoutMs: 30_000 },
    { memoryMb: 512, code: 'print(input())', timeoutMs: 10_000, stdin: '3 4' },
    { memoryMb: 2048, code: 'x', timeoutMs: 1500, files: { 'a.txt': 'aGk=' }, fetchFiles: ['out.txt'] },
    { memoryMb: 2048, code: 'y', timeoutMs: 10_000 },
    { memoryMb: 256, code: 'z', timeoutMs: 5000 },
  ]);
});

test('response shape for every native status, field by field', async () => {
  const cases: Array<[RunResult, number, unknown]> = [
    [
      result({ status: 'ok', exitCode: 0, stdout: '2\n', stderr: '', wallMs: 12 }),
      200,
      {
        status: 'Success',
        message: '',
        compile_result: null,
        run_result: { status: 'Finished', execution_time: 0.012, return_code: 0, stdout: '2\n', stderr: '' },
        executor_pod_name: 'pod-7',
        files: {},
      },
    ],
    [
      result({ status: 'error', exitCode: 3, stdout: 'before\n', stderr: 'Traceback\n', wallMs: 20 }),
      200,
      {
        status: 'Failed',
        message: '',
        compile_result: null,
        run_result: {
          status: 'Finished',
          execution_time: 0.02,
          return_code: 3,
          stdout: 'before\n',
          stderr: 'Traceback\n',
        },
        executor_pod_name: 'pod-7',
        files: {},
      },
    ],
    [
      result({
        status: 'timeout',
        exitCode: null,
        signal: 'SIGKILL',
        timedOut: true,
        stdout: 'tick\n',
        wallMs: 4000,
      }),
      200,
      {
        status: 'Failed',
        message: '',
        compile_result: null,
        run_result: {
          status: 'TimeLimitExceeded',
          execution_time: 4,
          return_code: null,
          stdout: 'tick\n',
          stderr: '',
        },
        executor_pod_name: 'pod-7',
        files: {},
      },
    ],
    [
      result({ status: 'oom', exitCode: 1, oom: true, stderr: 'MemoryError\n', wallMs: 30 }),
      200,
      {
        status: 'Failed',
        message: '',
        compile_result: null,
        run_result: {
          status: 'Finished',
          execution_time: 0.03,
          return_code: 1,
          stdout: '',
          stderr: 'MemoryError\n',
        },
        executor_pod_name: 'pod-7',
        files: {},
      },
    ],
    [
      result({
        status: 'oom',
        exitCode: null,
        signal: 'SIGKILL',
        oom: true,
        wallMs: 300,
        error: "memory limit: the call's processes held 1100 MB together (limit 1024 MB)",
      }),
      200,
      {
        status: 'Failed',
        message: "memory limit: the call's processes held 1100 MB together (limit 1024 MB)",
        compile_result: null,
        run_result: { status: 'Finished', execution_time: 0.3, return_code: -9, stdout: '', stderr: '' },
        executor_pod_name: 'pod-7',
        files: {},
      },
    ],
    [
      result({
        status: 'output_limit',
        exitCode: null,
        signal: 'SIGKILL',
        truncated: true,
        stdout: 'xxxx',
        wallMs: 50,
        error: 'output over 16777216 bytes',
      }),
      200,
      {
        status: 'Failed',
        message: 'output over 16777216 bytes',
        compile_result: null,
        run_result: { status: 'Finished', execution_time: 0.05, return_code: -9, stdout: 'xxxx', stderr: '' },
        executor_pod_name: 'pod-7',
        files: {},
      },
    ],
    [
      result({ status: 'output_limit', exitCode: null, signal: 'SIGKILL', truncated: true, wallMs: 50 }),
      200,
      {
        status: 'Failed',
        message: 'output limit: the run was killed for writing too much output',
        compile_result: null,
        run_result: { status: 'Finished', execution_time: 0.05, return_code: -9, stdout: '', stderr: '' },
        executor_pod_name: 'pod-7',
        files: {},
      },
    ],
    [
      result({ status: 'error', exitCode: null, signal: null, wallMs: 5, error: 'session s lost: crashed' }),
      200,
      {
        status: 'Failed',
        message: 'session s lost: crashed',
        compile_result: null,
        run_result: { status: 'Finished', execution_time: 0.005, return_code: 1, stdout: '', stderr: '' },
        executor_pod_name: 'pod-7',
        files: {},
      },
    ],
    [
      result({ status: 'killed', exitCode: null, signal: 'SIGSEGV', wallMs: 5 }),
      200,
      {
        status: 'Failed',
        message: '',
        compile_result: null,
        run_result: { status: 'Finished', execution_time: 0.005, return_code: -11, stdout: '', stderr: '' },
        executor_pod_name: 'pod-7',
        files: {},
      },
    ],
    [
      result({ status: 'ok', exitCode: 0, files: { 'o.txt': 'aGk=' }, wallMs: 1 }),
      200,
      {
        status: 'Success',
        message: '',
        compile_result: null,
        run_result: { status: 'Finished', execution_time: 0.001, return_code: 0, stdout: '', stderr: '' },
        executor_pod_name: 'pod-7',
        files: { 'o.txt': 'aGk=' },
      },
    ],
    [
      failedResult('invalid_input', 'file name not allowed (plain names only): "d/x.txt"'),
      200,
      {
        status: 'SandboxError',
        message: 'file name not allowed (plain names only): "d/x.txt"',
        compile_result: null,
        run_result: null,
        executor_pod_name: 'pod-7',
        files: {},
      },
    ],
    [
      failedResult('internal_error', 'runner failed: broker died'),
      200,
      {
        status: 'SandboxError',
        message: 'runner failed: broker died',
        compile_result: null,
        run_result: null,
        executor_pod_name: 'pod-7',
        files: {},
      },
    ],
    [
      failedResult('queue_timeout', 'could not start before the queue deadline'),
      504,
      {
        status: 'SandboxError',
        message: 'could not start before the queue deadline',
        compile_result: null,
        run_result: null,
        executor_pod_name: 'pod-7',
        files: {},
      },
    ],
  ];
  let i = 0;
  const { url } = await start({ runner: new FakeRunner(() => cases[i][0]), podName: 'pod-7' });
  for (; i < cases.length; i++) {
    const [r, status, want] = cases[i];
    const got = await postRaw(url, verlPayload({ code: `case ${i}` }));
    assert.equal(got.status, status, `${r.status}: HTTP status`);
    assert.deepEqual(Object.keys(got.body), RESPONSE_KEYS);
    if (got.body.run_result) assert.deepEqual(Object.keys(got.body.run_result), RUN_RESULT_KEYS);
    assert.deepEqual(got.body, want, `${r.status} (case ${i})`);
  }
});

test('real Python through /run_code: success, runtime error, timeout → TimeLimitExceeded, as verl reads them', {
  timeout: 60_000,
}, async () => {
  const { url } = await start();
  const ok = await postRaw(
    url,
    verlPayload({ code: 'import sys\nprint(6*7)\nprint("warn", file=sys.stderr)' }),
  );
  assert.equal(ok.status, 200);
  assert.equal(ok.body.status, 'Success');
  assert.equal(ok.body.run_result.status, 'Finished');
  assert.equal(ok.body.run_result.return_code, 0);
  assert.equal(ok.body.run_result.stdout, '42\n');
  assert.equal(ok.body.run_result.stderr, 'warn\n');
  assert.equal(typeof ok.body.run_result.execution_time, 'number');
  assert.deepEqual(verlView(ok.body), { status: 'success', code: true, toolText: '42\nwarn\n' });

  const withStdin = await postRaw(
    url,
    verlPayload({ code: 'print(sum(map(int, input().split())))', stdin: '3 4' }),
  );
  assert.equal(withStdin.body.run_result.stdout, '7\n');

  const err = await postRaw(url, verlPayload({ code: 'print("before")\nraise ValueError("boom")' }));
  assert.equal(err.body.status, 'Failed');
  assert.equal(err.body.message, '');
  assert.equal(err.body.run_result.status, 'Finished');
  assert.equal(err.body.run_result.return_code, 1);
  assert.equal(err.body.run_result.stdout, 'before\n');
  assert.match(err.body.run_result.stderr, /ValueError: boom/);
  assert.equal(verlView(err.body).status, 'runtime_error');
  assert.equal(verlView(err.body).code, -2);

  const slow = await postRaw(
    url,
    verlPayload({
      code: 'import time\nprint("tick", flush=True)\nwhile True: time.sleep(0.01)',
      timeout: 0.5,
    }),
  );
  assert.equal(slow.status, 200);
  assert.equal(slow.body.status, 'Failed');
  assert.equal(slow.body.run_result.status, 'TimeLimitExceeded');
  assert.equal(slow.body.run_result.return_code, null);
  assert.ok(slow.body.run_result.execution_time >= 0.5, `${slow.body.run_result.execution_time}`);
  assert.deepEqual(verlView(slow.body), { status: 'timeout', code: -3, toolText: 'no stdout here' });
});

test('languages: other SandboxFusion languages are a SandboxError; names it does not know are a 400', async () => {
  const runner = new FakeRunner();
  const { url } = await start({ runner, podName: 'p' });
  for (const language of ['cpp', 'nodejs', 'bash', 'python_gpu']) {
    const r = await postRaw(url, verlPayload({ code: 'int main(){}', language }));
    assert.equal(r.status, 200);
    assert.deepEqual(r.body, {
      status: 'SandboxError',
      message: `language '${language}' is not supported by this sandbox (it runs python only)`,
      compile_result: null,
      run_result: null,
      executor_pod_name: 'p',
      files: {},
    });
    assert.equal(verlView(r.body).status, 'sandbox_error');
  }
  // SandboxFusion's Language literal has no 'python3' (FastAPI answers 422); schema errors here are 400
  for (const body of [
    verlPayload({ code: 'print(1)', language: 'python3' }),
    JSON.stringify({ language: 'python' }),
    JSON.stringify({ code: 'x', language: 'python', run_timeout: 0 }),
    JSON.stringify({ code: 'x', language: 'python', files: { a: 3 } }),
  ]) {
    const r = await postRaw(url, body);
    assert.equal(r.status, 400, body);
    assert.match(r.body.error, /invalid request/);
  }
  assert.match((await postRaw(url, verlPayload({ code: 'x', language: 'python3' }))).body.error, /language/);
  assert.equal(runner.seen.length, 0, 'nothing ran');
});

test('executor_pod_name comes from $MY_POD_NAME by default, as in SandboxFusion', async () => {
  const before = process.env.MY_POD_NAME;
  process.env.MY_POD_NAME = 'sandbox-abc';
  try {
    const { url } = await start({ runner: new FakeRunner(), podName: undefined });
    assert.equal((await postRaw(url, verlPayload({ code: 'x' }))).body.executor_pod_name, 'sandbox-abc');
  } finally {
    if (before === undefined) delete process.env.MY_POD_NAME;
    else process.env.MY_POD_NAME = before;
  }
});

test('the request guard stands in front of /run_code (token, Origin)', async () => {
  const token = 'run-code-token-0123456789';
  const runner = new FakeRunner();
  const { url } = await start({ runner, token });
  assert.equal((await postRaw(url, verlPayload({ code: 'x' }))).status, 401);
  assert.equal(
    (
      await postRaw(url, verlPayload({ code: 'x' }), {
        authorization: `Bearer ${token}`,
        origin: 'http://evil.example',
      })
    ).status,
    403,
  );
  const ok = await postRaw(url, verlPayload({ code: 'x' }), { authorization: `Bearer ${token}` });
  assert.equal(ok.status, 200);
  assert.equal(ok.body.status, 'Success');
  assert.equal(runner.seen.length, 1);
});

test('a full queue answers 503 and an item past its queue deadline 504 (what verl retries), both SandboxFusion-shaped', async () => {
  const release: Array<() => void> = [];
  const runner = new FakeRunner((req) => new Promise((r) => release.push(() => r(okResult(req)))));
  // queue deadline: compile_timeout + 5 s, capped by longQueueWaitMs
  const { url } = await start({ runner, concurrency: 1, maxQueue: 1, longQueueWaitMs: 300 });
  const first = postRaw(url, verlPayload({ code: 'a' }));
  await new Promise((r) => setTimeout(r, 50));
  const second = postRaw(url, verlPayload({ code: 'b' }));
  await new Promise((r) => setTimeout(r, 50));
  const third = await postRaw(url, verlPayload({ code: 'c' }));
  assert.equal(third.status, 503);
  assert.equal(third.headers.get('retry-after'), '1');
  assert.equal(third.body.status, 'SandboxError');
  assert.match(third.body.message, /^busy: queue full/);
  assert.deepEqual(Object.keys(third.body), RESPONSE_KEYS);
  const late = await second;
  assert.equal(late.status, 504);
  assert.equal(late.body.status, 'SandboxError');
  assert.equal(late.body.run_result, null);
  assert.match(late.body.message, /queue deadline/);
  (release.shift() as () => void)();
  assert.equal((await first).body.status, 'Success');
  assert.equal(runner.seen.length, 1, 'the late item never ran');
});

test('files in and out, base64, through the isolated pool', {
  skip: findBwrap() ? false : 'bubblewrap not installed',
  timeout: 60_000,
}, async () => {
  const pool = await SandboxPool.start({ slots: 1, log: () => {} });
  cleanup.push(() => pool.close());
  const { url } = await start({ runner: pool, concurrency: 1 });
  const r = await postRaw(
    url,
    JSON.stringify({
      code: 'data = open("in.txt").read()\nopen("out.bin", "wb").write(bytes([0, 255]) + data[::-1].encode())\nprint(data)',
      language: 'python',
      files: { 'in.txt': Buffer.from('abc').toString('base64') },
      fetch_files: ['out.bin', 'missing.txt'],
    }),
  );
  assert.equal(r.status, 200);
  assert.equal(r.body.status, 'Success');
  assert.equal(r.body.run_result.stdout, 'abc\n');
  // a file that does not exist after the run is absent, as in SandboxFusion
  assert.deepEqual(r.body.files, {
    'out.bin': Buffer.from([0, 255, ...Buffer.from('cba')]).toString('base64'),
  });
  // paths beyond plain names are refused (SandboxFusion would create directories)
  const nested = await postRaw(
    url,
    JSON.stringify({ code: 'x', language: 'python', files: { 'd/x.txt': '' } }),
  );
  assert.equal(nested.body.status, 'SandboxError');
  assert.match(nested.body.message, /plain names only/);
  // the pool's own timeout and memory limit, as verl's tool sends them
  const [slow, big] = await Promise.all([
    postRaw(url, verlPayload({ code: 'print("t", flush=True)\nwhile True: pass', timeout: 0.5 })),
    postRaw(url, verlPayload({ code: 'x = bytearray(400 * 2**20)\nprint(len(x))', memoryLimitMb: 100 })),
  ]);
  assert.equal(slow.body.status, 'Failed');
  assert.equal(slow.body.run_result.status, 'TimeLimitExceeded');
  assert.equal(slow.body.run_result.return_code, null);
  assert.equal(slow.body.run_result.stdout, 't\n');
  assert.equal(big.body.status, 'Failed');
  assert.equal(big.body.run_result.status, 'Finished');
  assert.notEqual(big.body.run_result.return_code, 0);
  assert.match(big.body.run_result.stderr + big.body.message, /MemoryError|memory limit/);
});

test('GET /v1/ping answers "pong" as SandboxFusion does, without a token like /ping', async () => {
  const { url } = await start({ token: 'a-token-of-sixteen-chars' });
  const r = await fetch(`${url}/v1/ping`);
  assert.equal(r.status, 200);
  assert.equal(await r.json(), 'pong');
});
