import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, test } from 'node:test';
import { SandboxServer } from '../../src/sandbox/server.js';
import { buildToolCode, executePythonTool } from '../../src/sandbox/tool.js';
import { findPython } from '../../src/util/python.js';
import { SpawnRunner } from './helpers.js';

// The reference's client side (rstar2_agent/tools/code_judge_utils.py: call_long_batch + the tool
// text it builds), re-expressed with `requests` so it runs on Debian's python3: it must work against
// our service unchanged and produce the same text as our TS tool library.
const REFERENCE_CLIENT = `
import json, sys, time, requests
from dataclasses import dataclass
url, payloads = sys.argv[1], json.loads(sys.stdin.read())
# code-judge's judge_client reads /status as ServerStatus(**response.json()): any other key is a TypeError
@dataclass
class ServerStatus:
    queue: int
    num_workers: int
ServerStatus(**requests.get(url + "/status", timeout=10).json())
subs = [{"type": "python", "solution": p["code"], "input": p["input"] or None} for p in payloads]
results = [None] * len(subs)
pending = list(range(len(subs)))
for attempt in range(4):
    r = requests.post(url + "/run/long-batch", json={"type": "batch", "submissions": [subs[i] for i in pending]}, timeout=60)
    if r.status_code != 200:
        continue
    still = []
    for i, res in zip(pending, r.json()["results"]):
        if res["reason"] == "queue_timeout":
            still.append(i)
        else:
            results[i] = res
    pending = still
    if not pending:
        break
out = []
for res in results:
    if res["run_success"] and res["success"]:
        text = "Tool call success"
    else:
        text = f"Tool call failure\\nreason: {res['reason']}"
    if res["stdout"]:
        text += f"\\nstdout: {res['stdout']}"
    if res["stderr"]:
        text += f"\\nstderr: {res['stderr']}"
    text += f"\\nexecution time: {res['cost']:.2f}s"
    out.append(text)
print(json.dumps(out))
`;

const server = new SandboxServer({ runner: new SpawnRunner(), port: 0, log: () => {} });
after(() => server.close());

test('the reference client works unchanged and sees the same tool text', { timeout: 60_000 }, async () => {
  const { url } = await server.listen();
  const calls = [
    { code: 'x = 6\nx * 7', input: '' },
    { code: 'print(input()[::-1])', input: 'abc' },
    { code: 'print("a")\nundefined_name', input: '' },
  ];
  const payloads = calls.map((c) => ({ code: buildToolCode(c.code), input: c.input }));
  // Async: the server answers from this same process.
  const child = spawn(findPython(), ['-c', REFERENCE_CLIENT, url]);
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  child.stdin.end(JSON.stringify(payloads));
  const code = await new Promise((r) => child.on('close', r));
  assert.equal(code, 0, stderr);
  const texts = JSON.parse(stdout) as string[];
  const strip = (t: string) => t.replace(/execution time: [\d.]+s$/, 'execution time: Xs');
  assert.match(texts[0], /^Tool call success\nstdout: 42\n\nexecution time: [\d.]+s$/);
  assert.match(texts[1], /^Tool call success\nstdout: cba\n/);
  assert.match(
    texts[2],
    /^Tool call failure\nreason: \nstdout: a\n\nstderr: NameError at line 2: name 'undefined_name' is not defined\n/,
  );
  for (let i = 0; i < calls.length; i++) {
    const ours = await executePythonTool(calls[i], new SpawnRunner(), { budget: Infinity });
    assert.equal(strip(ours.fullText), strip(texts[i]));
  }
});
