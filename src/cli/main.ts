import { buildProgram } from './program.js';

// A reader that stops early (`rstar2 verify big.jsonl | head -1`) closes the pipe: that is the reader's
// choice, not a failure, so the command ends quietly as Unix tools do.
process.stdout.on('error', (e: NodeJS.ErrnoException) => {
  if (e.code !== 'EPIPE') throw e;
  process.exit(0);
});

// The entry point (bin/rstar2.js): parse the command line; a failing action prints one line (with
// RSTAR2_DEBUG, its stack) and exits 1. Option errors are commander's, also exit 1.
buildProgram()
  .parseAsync(process.argv)
  .catch((e: unknown) => {
    const err = e as Error;
    console.error(`rstar2: ${err.message}`);
    if (process.env.RSTAR2_DEBUG) console.error(err.stack);
    process.exit(1);
  });
