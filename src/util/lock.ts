import {
  closeSync,
  mkdirSync,
  openSync,
  readFileSync,
  statSync,
  unlinkSync,
  utimesSync,
  writeSync,
} from 'node:fs';
import { hostname } from 'node:os';
import { dirname, resolve } from 'node:path';

interface Holder {
  pid: number;
  host: string;
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

/** How often a holder touches its lock, and after how long without a touch a lock from another host is taken
 *  as its holder's last word: a job requeued on another node (Slurm, a rescheduled pod) must still resume. */
export const HEARTBEAT_MS = 30_000;
export const STALE_MS = 4 * HEARTBEAT_MS;

/**
 * Holds `dir` for this process until it exits: two processes writing one run or eval directory (two resumes, or
 * two runs started in the same second) overwrite each other's checkpoints. `dir/.lock` names the holder; one left
 * by a process that is gone (kill -9, a crash) is taken over, so a killed run still resumes: on this host when its
 * pid is gone, and from any host when it has not been touched for STALE_MS. Returns the release.
 */
const held = new Set<string>(); // lock files this process holds

export function lockDir(dir: string, what: string): () => void {
  mkdirSync(dir, { recursive: true });
  const file = resolve(dir, '.lock');
  const me: Holder = { pid: process.pid, host: hostname(), since: new Date().toISOString() };
  for (let tries = 0; ; tries++) {
    try {
      const fd = openSync(file, 'wx');
      writeSync(fd, `${JSON.stringify(me)}\n`);
      closeSync(fd);
      break;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      if (tries === 5)
        throw new Error(`${what} ${dir}: could not take ${file} (it comes back as soon as removed)`);
    }
    let h: Holder | undefined;
    let quiet = 0;
    try {
      quiet = Date.now() - statSync(file).mtimeMs;
      h = JSON.parse(readFileSync(file, 'utf8')) as Holder;
    } catch {
      // released meanwhile, or a holder killed between creating the file and writing it: nothing to keep
    }
    // a holder that stopped touching its lock is gone whatever its pid says: after a container restart the pid
    // may be another process's, or this one's
    const oldSelf = h?.pid === me.pid && !held.has(file);
    if (h && quiet < STALE_MS && !oldSelf && (h.host !== me.host || alive(h.pid))) {
      const where =
        h.host === me.host ? '' : ` on ${h.host} (its lock touched ${Math.round(quiet / 1000)} s ago)`;
      throw new Error(
        `${what} ${dir} is in use by process ${h.pid}${where} since ${h.since}: wait for it or stop it ` +
          `(delete ${file} only if that process is gone)`,
      );
    }
    try {
      unlinkSync(file);
    } catch {
      // released meanwhile
    }
  }
  held.add(file);
  const beat = setInterval(() => {
    try {
      const now = new Date();
      utimesSync(file, now, now);
    } catch {
      // the directory was removed under us: nothing left to hold
    }
  }, HEARTBEAT_MS).unref();
  const release = () => {
    clearInterval(beat);
    held.delete(file);
    try {
      if ((JSON.parse(readFileSync(file, 'utf8')) as Holder).pid === me.pid) unlinkSync(file);
    } catch {
      // already gone
    }
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
