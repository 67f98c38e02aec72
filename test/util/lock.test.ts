import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import {
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { freshDir, lockDir, lockFile, STALE_MS } from '../../src/util/lock.js';

const tmp = () => mkdtempSync(join(tmpdir(), 'rstar2-lock-'));
const ns = readlinkSync('/proc/self/ns/pid');

/** Another process that tries to lock `dir` ('held', kept 0.5 s, or 'refused'). */
// n processes try to lock `dir` at once; a holder keeps the lock until every one has answered (under load one that
// let go after a fixed time would free it for a late starter, which is no race), then all exit and release
async function race(dir: string, n: number): Promise<string[]> {
  const src = new URL('../../src/util/lock.ts', import.meta.url).pathname;
  const script = `import { lockDir } from ${JSON.stringify(src)};
    try { lockDir(${JSON.stringify(dir)}, 'run'); console.log('held'); process.stdin.on('end', () => process.exit(0)).resume(); }
    catch (e) { console.log('refused'); }`;
  const kids = Array.from({ length: n }, () =>
    spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script]),
  );
  const closed = kids.map((c) => new Promise((r) => c.on('close', r)));
  const got = await Promise.all(
    kids.map(
      (c) =>
        new Promise<string>((res) => {
          let out = '';
          c.stdout.on('data', (d) => {
            out += d;
            if (out.includes('\n')) res(out.trim());
          });
          c.on('close', () => res(out.trim()));
        }),
    ),
  );
  for (const c of kids) c.stdin.end();
  await Promise.all(closed);
  return got.sort();
}

test('a directory held by a live process is refused, naming it; released, it can be taken again', () => {
  const dir = join(tmp(), 'run');
  const release = lockDir(dir, 'run');
  assert.throws(
    () => lockDir(dir, 'run'),
    new RegExp(`run ${dir} is in use by process ${process.pid} since`),
  );
  release();
  assert.equal(existsSync(join(dir, '.lock')), false);
  lockDir(dir, 'run')();
  rmSync(dir, { recursive: true });
});

test("a lock left by a killed process is taken over; another host's once it has gone untouched", () => {
  const dir = tmp();
  const gone = spawnSync(process.execPath, ['-e', 'console.log(process.pid)'], { encoding: 'utf8' });
  const pid = Number(gone.stdout.trim());
  writeFileSync(join(dir, '.lock'), JSON.stringify({ pid, host: hostname(), ns, since: 'then' }));
  const release = lockDir(dir, 'run');
  assert.equal(JSON.parse(readFileSync(join(dir, '.lock'), 'utf8')).pid, process.pid);
  release();
  // another host's lock: its pid cannot be checked from here, so it holds while its holder keeps touching it
  writeFileSync(join(dir, '.lock'), JSON.stringify({ pid, host: 'elsewhere', since: 'then' }));
  assert.throws(
    () => lockDir(dir, 'eval'),
    /in use by process \d+ on elsewhere \(its lock touched 0 s ago\)/,
  );
  const old = new Date(Date.now() - STALE_MS - 1000);
  utimesSync(join(dir, '.lock'), old, old); // a job requeued on another node after its holder died
  lockDir(dir, 'eval')();
  // this very pid in a lock this process never took: a restarted container's node often gets its old pid back
  writeFileSync(
    join(dir, '.lock'),
    JSON.stringify({ pid: process.pid, host: hostname(), ns, since: 'then' }),
  );
  lockDir(dir, 'run')();
  rmSync(dir, { recursive: true });
});

test('two processes locking one directory at once: exactly one holds it', async () => {
  const dir = tmp();
  const got = await race(dir, 3);
  assert.deepEqual(got, ['held', 'refused', 'refused']);
  assert.equal(existsSync(join(dir, '.lock')), false); // released at exit
  rmSync(dir, { recursive: true });
});

test('a pid is only checked where it means the same: another host, or another pid namespace here, waits for the heartbeat', () => {
  const dir = tmp();
  const dead = Number(
    spawnSync(process.execPath, ['-e', 'console.log(process.pid)'], { encoding: 'utf8' }).stdout,
  );
  // a pod on another node whose process has this process's pid; a container beside this one (host networking:
  // the same host name) whose pid is dead in this namespace but not in its own
  for (const h of [
    { pid: process.pid, host: 'node-b', ns },
    { pid: dead, host: hostname(), ns: 'pid:[1]' },
  ]) {
    writeFileSync(join(dir, '.lock'), JSON.stringify({ ...h, since: 'then' }));
    assert.throws(() => lockDir(dir, 'run'), /is in use by process/);
  }
  rmSync(dir, { recursive: true });
});

test('where its pid can be checked, a live holder keeps an old lock (stopped with ^Z); an unreadable one goes by age', () => {
  const dir = tmp();
  const lock = join(dir, '.lock');
  const old = new Date(Date.now() - STALE_MS - 1000);
  const sleeper = spawn('sleep', ['30']);
  try {
    writeFileSync(lock, JSON.stringify({ pid: sleeper.pid, host: hostname(), ns, since: 'then' }));
    utimesSync(lock, old, old);
    assert.throws(() => lockDir(dir, 'run'), new RegExp(`in use by process ${sleeper.pid} since then`));
  } finally {
    sleeper.kill();
  }
  writeFileSync(lock, ''); // a holder of an older version cut short between creating and writing it
  assert.throws(() => lockDir(dir, 'run'), /in use by a process on \? \(its lock touched 0 s ago\)/);
  utimesSync(lock, old, old);
  lockDir(dir, 'run')();
  rmSync(dir, { recursive: true });
});

test('a file is locked beside it, once for all its names (a link to it takes the same lock)', () => {
  const dir = tmp();
  const out = join(dir, 'traj.jsonl');
  writeFileSync(out, '');
  symlinkSync(out, join(dir, 'alias.jsonl'));
  const release = lockFile(out, 'rollout --out');
  assert.ok(existsSync(`${out}.lock`));
  assert.throws(() => lockFile(join(dir, 'alias.jsonl'), 'rollout --out'), /is in use by process/);
  release();
  assert.deepEqual(readdirSync(dir).sort(), ['alias.jsonl', 'traj.jsonl']);
  rmSync(dir, { recursive: true });
});

test('a takeover left half-done by a killed process delays the next one until it is stale, and is cleared', () => {
  const dir = tmp();
  const lock = join(dir, '.lock');
  const old = new Date(Date.now() - STALE_MS - 1000);
  writeFileSync(lock, JSON.stringify({ pid: 1, host: 'gone', since: 'then' }));
  utimesSync(lock, old, old);
  const mutex = `${lock}.takeover`;
  writeFileSync(mutex, '');
  const nearlyStale = new Date(Date.now() - 9_700); // the takeover lock goes stale at 10 s
  utimesSync(mutex, nearlyStale, nearlyStale);
  const t0 = Date.now();
  lockDir(dir, 'run')();
  assert.ok(Date.now() - t0 >= 200, `waited ${Date.now() - t0} ms for the takeover lock to go stale`);
  assert.deepEqual(readdirSync(dir), []);
  rmSync(dir, { recursive: true });
});

test('processes racing to take over one stale lock: exactly one holds it, and nothing is left behind', async () => {
  const dir = tmp();
  writeFileSync(join(dir, '.lock'), JSON.stringify({ pid: 1, host: 'gone', since: 'then' }));
  const old = new Date(Date.now() - STALE_MS - 1000);
  utimesSync(join(dir, '.lock'), old, old);
  const got = await race(dir, 6);
  assert.deepEqual(got, ['held', 'refused', 'refused', 'refused', 'refused', 'refused']);
  assert.deepEqual(readdirSync(dir), []); // released at exit, no temporary or set-aside files
  rmSync(dir, { recursive: true });
});

test('runs started in the same second get directories of their own', () => {
  const base = join(tmp(), 'runs', 'quickstart-roc-20261126T111406');
  assert.deepEqual([freshDir(base), freshDir(base), freshDir(base)], [base, `${base}-2`, `${base}-3`]);
});

test('`rstar2 train` refuses a run directory another process holds, before starting anything', () => {
  const dir = join(tmp(), 'run');
  const release = lockDir(dir, 'run');
  const bin = new URL('../../bin/rstar2.js', import.meta.url).pathname;
  const r = spawnSync(process.execPath, [bin, 'train', '--recipe', 'quickstart', '--out', dir], {
    encoding: 'utf8',
  });
  release();
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, new RegExp(`run ${dir} is in use by process ${process.pid}`));
  assert.doesNotMatch(r.stderr, /run directory:/);
  rmSync(dir, { recursive: true });
});
