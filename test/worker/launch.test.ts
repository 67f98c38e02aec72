import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import { findPython, PYTHON_DIR } from '../../src/util/python.js';
import { checkLaunch, PolicyWorker, parseMaster, rankEnvs } from '../../src/worker/index.js';

test("rank environments follow torchrun's: global rank = node rank × ranks per node + local rank", () => {
  const envs = rankEnvs(
    { ranks: 4, nnodes: 3, nodeRank: 2, master: '10.0.0.7:29500' },
    parseMaster('10.0.0.7:29500'),
  );
  assert.deepEqual(
    envs.map((e) => [e.RANK, e.LOCAL_RANK, e.WORLD_SIZE, e.LOCAL_WORLD_SIZE, e.GROUP_RANK]),
    [
      ['8', '0', '12', '4', '2'],
      ['9', '1', '12', '4', '2'],
      ['10', '2', '12', '4', '2'],
      ['11', '3', '12', '4', '2'],
    ],
  );
  assert.ok(envs.every((e) => e.MASTER_ADDR === '10.0.0.7' && e.MASTER_PORT === '29500'));
  const one = rankEnvs({ ranks: 2 }, { addr: '127.0.0.1', port: 4242 });
  assert.deepEqual(
    one.map((e) => [e.RANK, e.WORLD_SIZE]),
    [
      ['0', '2'],
      ['1', '2'],
    ],
  );
  assert.deepEqual(parseMaster('[fe80::1]:29500'), { addr: 'fe80::1', port: 29500 });
  assert.deepEqual(parseMaster('node-0.cluster:1234'), { addr: 'node-0.cluster', port: 1234 });
});

test('bad layouts are refused with the flag and the problem', async () => {
  assert.throws(() => parseMaster('10.0.0.7'), /--master must be ADDR:PORT .* got "10.0.0.7"/);
  assert.throws(() => parseMaster('10.0.0.7:70000'), /--master port must be in 1..65535, got 70000/);
  assert.throws(() => parseMaster('[nope]:29500'), /not an IPv6 address/);
  assert.throws(
    () => checkLaunch({ nnodes: 2, nodeRank: 2, master: 'h:1' }),
    /node-rank 2 is out of range: nodes are numbered 0..1 \(--nnodes 2\)/,
  );
  assert.throws(() => checkLaunch({ nnodes: 2 }), /--nnodes 2 needs --master ADDR:PORT/);
  assert.throws(() => checkLaunch({ ranks: 0 }), /nproc-per-node must be an integer ≥ 1, got 0/);
  await assert.rejects(PolicyWorker.start({ nnodes: 2, nodeRank: 1, master: 'h:1' }), /holds no client/);
  await assert.rejects(
    PolicyWorker.start({ sharding: 'zero' as 'ddp' }),
    /sharding must be one of ddp, fsdp/,
  );
  await assert.rejects(
    PolicyWorker.start({ offloadOptimizer: true }),
    /offloadOptimizer needs sharding: fsdp/,
  );
});

test('sharding: fsdp picks FSDP2 from torch 2.4, FSDP1 on 2.2–2.3, and refuses an older torch, whatever torch is here', () => {
  // the version gate is tested on version strings, and the refusal through from_env with torch's version
  // replaced, so the test means the same on any installed torch and starts no worker (it cannot hang)
  const py = (code: string, env: Record<string, string> = {}) =>
    spawnSync(findPython(), ['-c', code], {
      env: { ...process.env, PYTHONPATH: PYTHON_DIR, ...env },
      encoding: 'utf8',
      timeout: 60_000,
    });
  // the rank as the worker builds it at start-up: its settings read from the environment, then torchrun's variables
  const FROM_ENV =
    'from rstar2_worker.settings import Settings\nfrom rstar2_worker.train.dist import from_env\nr = from_env(Settings.from_env())';
  const pick = py(
    'from rstar2_worker.train.dist import fsdp_flavour as f\n' +
      "print([f(v) for v in ['2.4.0', '2.6.0+cu124', '2.10.1', '2.13.0+cpu', '2.2.1', '2.3.0a0']])\n" +
      "for v in ['2.1.2', '1.13.0a0']:\n" +
      '    try:\n        f(v)\n    except RuntimeError as e:\n        print(e)\n',
  );
  assert.equal(pick.status, 0, pick.stderr);
  assert.deepEqual(pick.stdout.trim().split('\n'), [
    "['fsdp2', 'fsdp2', 'fsdp2', 'fsdp2', 'fsdp1', 'fsdp1']",
    'sharding: fsdp needs torch >= 2.2 (FSDP2 from 2.4); this torch is 2.1',
    'sharding: fsdp needs torch >= 2.2 (FSDP2 from 2.4); this torch is 1.13',
  ]);
  const old = py(`import torch\ntorch.__version__ = "1.13.1"\n${FROM_ENV}`, {
    RSTAR2_SHARDING: 'fsdp',
  });
  assert.match(
    old.stderr,
    /RuntimeError: sharding: fsdp needs torch >= 2.2 \(FSDP2 from 2.4\); this torch is 1.13/,
  );
  const here = py(`${FROM_ENV}\nprint(r.fsdp)`, {
    RSTAR2_SHARDING: 'fsdp',
  });
  assert.equal(here.status, 0, here.stderr);
  assert.match(here.stdout, /^fsdp[12]$/m);
  // the worker reads torchrun's variables and says what is wrong with them
  const env = py(FROM_ENV, { WORLD_SIZE: '2', RANK: '2' });
  assert.match(env.stderr, /RANK=2 must be in \[0, WORLD_SIZE=2\)/);
  const noMaster = py(FROM_ENV, {
    WORLD_SIZE: '2',
    RANK: '1',
  });
  assert.match(noMaster.stderr, /WORLD_SIZE=2 needs MASTER_ADDR and MASTER_PORT/);
});

test('bench/gpu-check.sh stops at once, naming what is missing, on a machine without CUDA or torch', () => {
  const r = spawnSync('bash', ['bench/gpu-check.sh'], {
    env: { ...process.env, RSTAR2_PYTHON: '/usr/bin/python3' },
    encoding: 'utf8',
  });
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /gpu-check: torch is not importable by \/usr\/bin\/python3/);
  const cpu = spawnSync('bash', ['bench/gpu-check.sh'], {
    env: { ...process.env, RSTAR2_PYTHON: findPython() },
    encoding: 'utf8',
  });
  assert.equal(cpu.status, 2, cpu.stderr);
  assert.match(cpu.stderr, /gpu-check: no CUDA device is visible to .* \(torch 2\./);
  const none = spawnSync('bash', ['bench/gpu-check.sh'], {
    env: { ...process.env, RSTAR2_PYTHON: '/nonexistent/python3' },
    encoding: 'utf8',
  });
  assert.equal(none.status, 2);
  assert.match(none.stderr, /gpu-check: no python at '\/nonexistent\/python3'; set RSTAR2_PYTHON/);
});
