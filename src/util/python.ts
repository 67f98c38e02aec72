import { existsSync } from 'node:fs';

// Debian's interpreter carries python3-torch and is what the sandbox runs; pyenv shims on PATH are
// slow to start and have no torch, so PATH lookup is deliberately not the default. The worker and the sandbox
// read separate variables: on a GPU machine torch lives in a venv or conda (RSTAR2_PYTHON), while the sandbox
// mounts only /usr and needs an interpreter there (RSTAR2_SANDBOX_PYTHON).
export function findPython(
  explicit?: string,
  env: 'RSTAR2_PYTHON' | 'RSTAR2_SANDBOX_PYTHON' = 'RSTAR2_PYTHON',
): string {
  const candidate = explicit ?? process.env[env] ?? '/usr/bin/python3';
  if (!existsSync(candidate)) {
    throw new Error(
      `Python interpreter not found at ${candidate}. Install Debian's python3 (apt-get install python3) ` +
        `or point ${env} at an interpreter.`,
    );
  }
  return candidate;
}

export const PYTHON_DIR = new URL('../../python/', import.meta.url).pathname;
