// Flags for the benchmarks: node's parseArgs, strict, plus --help, which prints the bench's header comment
// (where each documents what it measures and how to run it). A misspelt flag stops the run with its name
// instead of a stack trace or, worse, a silent default run.
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type ParseArgsConfig, parseArgs } from 'node:util';

export function benchArgs<T extends ParseArgsConfig>(
  meta: string,
  config: T,
): ReturnType<typeof parseArgs<T>> {
  const file = fileURLToPath(meta);
  const argv = config.args ?? process.argv.slice(2);
  if (argv.includes('--help') || argv.includes('-h')) {
    const head: string[] = [];
    for (const line of readFileSync(file, 'utf8').split('\n')) {
      if (!line.startsWith('//')) break;
      head.push(line.replace(/^\/\/ ?/, ''));
    }
    console.log(head.join('\n'));
    process.exit(0);
  }
  try {
    return parseArgs(config);
  } catch (e) {
    console.error(`${basename(file)}: ${(e as Error).message} (--help: what it takes)`);
    process.exit(2);
  }
}

/** The median (the mean of the two middle values for an even count). */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}
