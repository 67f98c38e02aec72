import {
  closeSync,
  copyFileSync,
  existsSync,
  fstatSync,
  linkSync,
  mkdirSync,
  openSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  renameSync,
  rmSync,
  type Stats,
  statSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { hostname } from 'node:os';
import { dirname, resolve } from 'node:path';

interface Holder {
  pid: number;
  host: string;
  ns: string; // the pid namespace: containers on one host (host networking) share its name, not their pids
  since: string;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM'; // someone else's process, but there
  }
}

/** This process's pid namespace (a link target), '' where /proc cannot say. */
export function pidNamespace(): string {
  try {
    return readlinkSync('/proc/self/ns/pid');
  } catch {
    return '';
  }
}

/** Whether the process a record names has gone: null where its pid cannot be checked from here. */
export function processGone(h: { pid: number; host: string; ns: string }): boolean | null {
  return h.host === hostname() && h.ns === pidNamespace() ? !alive(h.pid) : null;
}

/** How often a holder touches its lock, and after how long without a touch a lock whose pid cannot be checked
 *  from here is taken as its holder's last word: a job requeued on another node must still resume. */
export const HEARTBEAT_MS = 30_000;
export const STALE_MS = 4 * HEARTBEAT_MS;

const held = new Set<string>(); // lock files this process holds

/**
 * Holds `dir` for this process until it exits: two processes writing one run or eval directory (two resumes, or
 * two runs started in the same second) overwrite each other's checkpoints. `dir/.lock` names the holder; one left
 * by a process that is gone (kill -9, a crash) is taken over, so a killed run still resumes: where its pid can be
 * checked (same host and pid namespace) once that pid is gone, elsewhere once untouched for STALE_MS.
 * Returns the release.
 */
export function lockDir(dir: string, what: string): () => void {
  mkdirSync(dir, { recursive: true });
  return hold(dir, resolve(dir, '.lock'), what);
}

/** The same for a file that a process appends to (`rollout --out`): the lock is `<path>.lock` beside it, beside the
 *  file a link points to (two names for one file take one lock). */
export function lockFile(path: string, what: string): () => void {
  return hold(path, `${existsSync(path) ? realpathSync(path) : resolve(path)}.lock`, what);
}

const TAKEOVER_STALE_MS = 10_000; // a takeover lasts microseconds; one this old was left by a process that died in it

/**
 * Replaces the stale lock `file` (as `st` and its `text` were judged) by `tmp`'s content. 'busy': another process
 * is taking it over (wait and look again); 'changed': released, taken or touched meanwhile (look again).
 */
function takeOver(file: string, tmp: string, st: Stats, text: string): 'taken' | 'busy' | 'changed' {
  const mutex = `${file}.takeover`;
  let ino: number;
  try {
    const fd = openSync(mutex, 'wx'); // made now, so its age is the takeover's
    ino = fstatSync(fd).ino;
    closeSync(fd);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    const m = statSync(mutex, { throwIfNoEntry: false });
    if (m && Date.now() - m.mtimeMs > TAKEOVER_STALE_MS) rmSync(mutex, { force: true });
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 5); // let its holder finish
    return 'busy';
  }
  const mine = `${tmp}.new`;
  try {
    // the same inode, time and holder: an inode freed and reused within one tick of a coarse clock is told apart
    // by its content
    const now = statSync(file, { throwIfNoEntry: false });
    if (now?.ino !== st.ino || now.mtimeMs !== st.mtimeMs || readFileSync(file, 'utf8') !== text)
      return 'changed';
    copyFileSync(tmp, mine);
    renameSync(mine, file);
    return 'taken';
  } finally {
    rmSync(mine, { force: true });
    // ours only: past TAKEOVER_STALE_MS (a stopped process) another may have broken it and made its own
    if (statSync(mutex, { throwIfNoEntry: false })?.ino === ino) rmSync(mutex, { force: true });
  }
}

function hold(dir: string, file: string, what: string): () => void {
  const me: Holder = {
    pid: process.pid,
    host: hostname(),
    ns: pidNamespace(),
    since: new Date().toISOString(),
  };
  const tmp = `${file}.${me.pid}.${Math.random().toString(36).slice(2)}`;
  writeFileSync(tmp, `${JSON.stringify(me)}\n`);
  try {
    for (let tries = 0; ; tries++) {
      try {
        linkSync(tmp, file); // appears whole, content and all, or not at all
        break;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
        if (tries === 5)
          throw new Error(`${what} ${dir}: could not take ${file} (it comes back as soon as removed)`);
      }
      let st: ReturnType<typeof statSync>;
      try {
        st = statSync(file);
      } catch {
        continue; // released meanwhile
      }
      let h: Holder | undefined;
      let text = '';
      try {
        text = readFileSync(file, 'utf8');
        h = JSON.parse(text) as Holder;
      } catch {
        // unreadable (cut short by a crash): only its age can say
      }
      const quiet = Date.now() - st.mtimeMs;
      const checkable = h !== undefined && h.host === me.host && h.ns === me.ns;
      // Where the pid can be checked it decides, however old the lock (a holder stopped with ^Z, or a machine
      // woken from sleep, is still there), and this very pid in a lock this process never took is a restarted
      // container's process that got its old pid back. Elsewhere only the heartbeat can say.
      const holding = h && checkable ? (h.pid === me.pid ? held.has(file) : alive(h.pid)) : quiet < STALE_MS;
      if (holding) {
        const who = h ? `process ${h.pid}` : 'a process';
        const where = checkable
          ? ''
          : ` on ${h?.host ?? '?'} (its lock touched ${Math.round(quiet / 1000)} s ago)`;
        throw new Error(
          `${what} ${dir} is in use by ${who}${where} since ${h?.since ?? '?'}: wait for it or stop it ` +
            `(delete ${file} only if that process is gone)`,
        );
      }
      // Take the stale lock over under a second lock, and replace it in one rename, so that the path never lacks
      // a lock: moving it aside first let a third process link its own in the gap while a slower racer moved
      // the new holder's away, and two processes held it (seen in CI with six racers).
      const got = takeOver(file, tmp, st, text);
      if (got === 'taken') break;
      if (got === 'busy') tries--; // waiting out another's takeover is not a failed try
    }
  } finally {
    rmSync(tmp, { force: true });
  }
  held.add(file);
  const content = readFileSync(file, 'utf8');
  const ours = () => {
    try {
      return readFileSync(file, 'utf8') === content;
    } catch {
      return false;
    }
  };
  const beat = setInterval(() => {
    if (!ours()) return; // taken over after this process stalled: never keep another's lock fresh
    try {
      const now = new Date();
      utimesSync(file, now, now);
    } catch {
      // released or removed meanwhile
    }
  }, HEARTBEAT_MS).unref();
  const release = () => {
    clearInterval(beat);
    held.delete(file);
    if (ours()) rmSync(file, { force: true });
    process.off('exit', release);
  };
  process.on('exit', release);
  return release;
}

/** The first of `base`, `base-2`, `base-3`, … that this process creates: runs started in the same second (the
 *  default name is down to the second) each get their own. */
export function freshDir(base: string): string {
  mkdirSync(dirname(base), { recursive: true });
  for (let i = 1; ; i++) {
    const d = i === 1 ? base : `${base}-${i}`;
    try {
      mkdirSync(d);
      return d;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
  }
}
