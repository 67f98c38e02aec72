import { closeSync, mkdirSync, openSync, readFileSync, unlinkSync, writeSync } from 'node:fs';
import { hostname } from 'node:os';
import { dirname, join } from 'node:path';

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

/**
 * Holds `dir` for this process until it exits: two processes writing one run or eval directory (two resumes, or
 * two runs started in the same second) overwrite each other's checkpoints. `dir/.lock` names the holder; one left
 * by a process that is gone (kill -9, a crash) is taken over, so a killed run still resumes. Returns the release.
 */
export function lockDir(dir: string, what: string): () => void {
  mkdirSync(dir, { recursive: true });
  const file = join(dir, '.lock');
  const me: Holder = { pid: process.pid, host: hostname(), since: new Date().toISOString() };
  for (let tries = 0; ; tries++) {
    try {
      const fd = openSync(file, 'wx');
      writeSync(fd, `${JSON.stringify(me)}\n`);
      closeSync(fd);
      break;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST' || tries > 0) throw e;
    }
    let h: Holder | undefined;
    try {
      h = JSON.parse(readFileSync(file, 'utf8')) as Holder;
    } catch {
      // a holder killed between creating the file and writing it: nothing to keep
    }
    if (h && (h.host !== me.host || alive(h.pid))) {
      const where = h.host === me.host ? '' : ` on ${h.host} (not checkable from here)`;
      throw new Error(
        `${what} ${dir} is in use by process ${h.pid}${where} since ${h.since}: wait for it or stop it ` +
          `(delete ${file} only if that process is gone)`,
      );
    }
    unlinkSync(file);
  }
  const release = () => {
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
