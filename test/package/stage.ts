import { spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';

// A throw-away copy of the checkout (what git would see: .gitignore'd paths left out) with node_modules
// linked in, so packaging tests and benchmarks can build and pack without touching the working tree's dist/.

export const REPO = new URL('../../', import.meta.url).pathname.replace(/\/$/, '');

/** Patterns of the repo's .gitignore this copy honours: top-level names (`dist/`, `/tmp/`) and basenames. */
function ignored(): { top: Set<string>; anywhere: RegExp[] } {
  const top = new Set(['.git', 'node_modules']);
  const anywhere: RegExp[] = [];
  for (let line of readFileSync(join(REPO, '.gitignore'), 'utf8').split('\n')) {
    line = line.trim();
    if (!line || line.startsWith('#')) continue;
    const name = line.replace(/^\//, '').replace(/\/$/, '');
    if (name.includes('*')) anywhere.push(new RegExp(`^${name.replace(/\./g, '\\.').replace(/\*/g, '.*')}$`));
    else if (line.startsWith('/')) top.add(name);
    else {
      top.add(name);
      anywhere.push(new RegExp(`^${name.replace(/\./g, '\\.')}$`));
    }
  }
  return { top, anywhere };
}

/** Copies the checkout to a new temp dir; `dir` is the copy, `remove()` deletes it. */
export function stageCheckout(prefix = 'rstar2-stage-'): { dir: string; remove: () => void } {
  const base = mkdtempSync(join(tmpdir(), prefix));
  const dir = join(base, 'rstar2');
  const { top, anywhere } = ignored();
  for (const name of readdirSync(REPO)) {
    if (top.has(name)) continue;
    cpSync(join(REPO, name), join(dir, name), {
      recursive: true,
      filter: (src) => !anywhere.some((re) => re.test(basename(src))),
    });
  }
  symlinkSync(join(REPO, 'node_modules'), join(dir, 'node_modules'), 'dir');
  return { dir, remove: () => rmSync(base, { recursive: true, force: true }) };
}

/** Environment for a child npm: this process's, less what an outer `npm test` put there for itself. */
export function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!/^npm_(config|package|lifecycle|command|execpath|node_execpath)/i.test(k)) env[k] = v;
  }
  return { ...env, ...extra };
}

export interface Ran {
  status: number | null;
  stdout: string;
  stderr: string;
  ms: number;
}

/** Runs a command to completion; throws with its output when it fails (unless `allowFail`). */
export function sh(
  cmd: string,
  args: string[],
  opts: { cwd: string; env?: NodeJS.ProcessEnv; input?: string; allowFail?: boolean; timeoutMs?: number },
): Ran {
  const t0 = performance.now();
  const r = spawnSync(cmd, args, {
    cwd: opts.cwd,
    env: opts.env ?? cleanEnv(),
    input: opts.input,
    encoding: 'utf8',
    timeout: opts.timeoutMs ?? 240_000,
    maxBuffer: 64 << 20,
  });
  const ran = {
    status: r.status,
    stdout: r.stdout ?? '',
    stderr: r.stderr ?? '',
    ms: performance.now() - t0,
  };
  if (!opts.allowFail && r.status !== 0) {
    throw new Error(
      `${cmd} ${args.join(' ')} (in ${opts.cwd}) exited ${r.status}${r.error ? ` (${r.error.message})` : ''}\n` +
        `${ran.stdout.slice(-4000)}\n${ran.stderr.slice(-4000)}`,
    );
  }
  return ran;
}
