import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { twoNodes } from '../worker/netns.js';
import { type ServeProcess, startServe } from './serve-process.js';
import { SERVE_ARGS, SERVE_ENV, servedRl } from './serve-rl-scenario.js';

// RL on two served engines (serve-rl-scenario.ts), on loopback, and with the trainer and the engines in two network
// namespaces (test/worker/netns.ts), so the broadcast crosses an interface as between hosts.

const dir = mkdtempSync(join(tmpdir(), 'rstar2-serve-rl-'));
const procs: ServeProcess[] = [];
after(async () => {
  await Promise.all(procs.map((p) => p.stop('SIGKILL')));
  rmSync(dir, { recursive: true, force: true });
});

test('RL on two served engines: broadcast after every update, an engine killed mid-rollout and restarted', {
  timeout: 600_000,
}, async () => {
  await servedRl(join(dir, 'loopback'), async (model, o) => {
    const p = await startServe(model, { env: SERVE_ENV, args: SERVE_ARGS, ...o });
    procs.push(p);
    return p;
  });
});

const nodes = twoNodes();
after(() => {
  if (typeof nodes !== 'string') nodes.close();
});

test('the same with the trainer and the engines in two network namespaces', {
  timeout: 720_000,
}, async (t) => {
  if (typeof nodes === 'string') return t.skip(nodes);
  const argv = [
    ...nodes.exec(0),
    'env',
    `GLOO_SOCKET_IFNAME=${nodes.devs[0]}`, // the namespace's own name resolves to loopback (netns.ts)
    process.execPath,
    '--import',
    'tsx',
    'test/engines/serve-rl-main.ts',
    join(dir, 'netns'),
    JSON.stringify(nodes.exec(1)),
    nodes.addrs[1],
    nodes.devs[1],
  ];
  const r = await new Promise<{ code: number | null; out: string }>((resolve) => {
    const p = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    p.stdout.on('data', (c) => (out += c));
    p.stderr.on('data', (c) => (out += c));
    const timer = setTimeout(() => p.kill('SIGKILL'), 660_000);
    p.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /serve-rl-main: passed/);
});
