import { existsSync } from 'node:fs';
import { isAbsolute, resolve } from 'node:path';

const ROOT = new URL('../../', import.meta.url).pathname;

/** The venv scripts/setup.sh makes for the policy worker (RSTAR2_VENV, else .venv at the project root). */
export function projectVenv(): string {
  const v = process.env.RSTAR2_VENV || '.venv';
  return isAbsolute(v) ? v : resolve(ROOT, v);
}

// The policy worker runs the project venv's interpreter (torch from pip), RSTAR2_PYTHON overriding it (a conda
// env on a cluster). The sandbox reads its own variable and defaults to Debian's /usr/bin/python3: it mounts only
// /usr, so a venv's interpreter cannot run inside it. pyenv shims on PATH are slow to start and have no torch, so
// PATH lookup is deliberately never the default.
export function findPython(
  explicit?: string,
  env: 'RSTAR2_PYTHON' | 'RSTAR2_SANDBOX_PYTHON' = 'RSTAR2_PYTHON',
): string {
  const venv = `${projectVenv()}/bin/python`;
  const fallback = env === 'RSTAR2_PYTHON' && existsSync(venv) ? venv : '/usr/bin/python3';
  const candidate = explicit ?? (process.env[env] || fallback);
  if (!existsSync(candidate)) {
    throw new Error(
      `Python interpreter not found at ${candidate}. ` +
        (env === 'RSTAR2_PYTHON'
          ? 'Run `bash scripts/setup.sh` (it makes the worker venv, .venv) or point RSTAR2_PYTHON at an interpreter with torch.'
          : "Install Debian's python3 (apt-get install python3) or point RSTAR2_SANDBOX_PYTHON at an interpreter under /usr."),
    );
  }
  return candidate;
}

export const PYTHON_DIR = new URL('../../python/', import.meta.url).pathname;
