import { existsSync } from 'node:fs';

// Debian's interpreter carries python3-torch and is what the sandbox runs; pyenv shims on PATH are
// slow to start and have no torch, so PATH lookup is deliberately not the default.
export function findPython(explicit?: string): string {
  const candidate = explicit ?? process.env.RSTAR2_PYTHON ?? '/usr/bin/python3';
  if (!existsSync(candidate)) {
    throw new Error(
      `Python interpreter not found at ${candidate}. Install Debian's python3 (apt-get install python3) ` +
        'or point RSTAR2_PYTHON at an interpreter.',
    );
  }
  return candidate;
}

export const PYTHON_DIR = new URL('../../python/', import.meta.url).pathname;
