// The CLI's shared option helpers (vocabulary: docs/DECISIONS.md, "cli").
//
// Numbers: every numeric option takes one of the parsers below as its commander argParser, so a bad value is
// refused while the command line is parsed, before anything starts, with commander's message naming the
// option and the value, then ours saying what was expected:
//   error: option '--workers <n>' argument 'abc' is invalid. Expected an integer >= 1.
// and exit code 1.
//
// Renames: deprecatedAliases() keeps an old option name working for one release: hidden from --help, parsed
// like the new option and stored under its name, with a one-line note on stderr.
import { type Command, InvalidArgumentError, Option } from 'commander';

/** An argParser made here; `expected` says what it accepts (tests walk every command's options by it). */
export type NumberParser = ((value: string) => number) & { readonly expected: string };

interface Range {
  min?: number;
  max?: number;
  /** `min` itself is refused (a float that must be strictly positive). */
  minExclusive?: boolean;
}

// Plain decimal notation only: Number() alone would also take '', ' ', '0x1f', '0b1' and 'Infinity'.
const DECIMAL = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i;

function bounds({ min, max, minExclusive }: Range): string {
  if (min !== undefined && max !== undefined)
    return minExclusive ? ` > ${min} and <= ${max}` : ` from ${min} to ${max}`;
  if (min !== undefined) return ` ${minExclusive ? '>' : '>='} ${min}`;
  if (max !== undefined) return ` <= ${max}`;
  return '';
}

function numberParser(kind: 'an integer' | 'a number', range: Range, expected?: string): NumberParser {
  const what = expected ?? `${kind}${bounds(range)}`;
  const parse = (value: string): number => {
    const s = value.trim();
    const x = DECIMAL.test(s) ? Number(s) : Number.NaN;
    const ok =
      Number.isFinite(x) &&
      (kind === 'a number' || Number.isSafeInteger(x)) &&
      (range.min === undefined || (range.minExclusive ? x > range.min : x >= range.min)) &&
      (range.max === undefined || x <= range.max);
    if (!ok) throw new InvalidArgumentError(`Expected ${what}.`);
    return x;
  };
  return Object.assign(parse, { expected: what });
}

/** An integer, optionally within [min, max]. */
export const int = (range: Range = {}): NumberParser => numberParser('an integer', range);
/** An integer >= 1 (counts, sizes, limits), optionally <= max. */
export const positiveInt = (max?: number): NumberParser =>
  numberParser('an integer', { min: 1, max }, max === undefined ? 'a positive integer' : undefined);
/** An integer >= 0, optionally <= max. */
export const nonNegativeInt = (max?: number): NumberParser =>
  numberParser('an integer', { min: 0, max }, max === undefined ? 'a non-negative integer' : undefined);
/** A finite number, optionally within a range. */
export const float = (range: Range = {}): NumberParser => numberParser('a number', range);
/** A TCP port; 0 asks the system for any free one. */
export const port = (): NumberParser =>
  numberParser('an integer', { min: 0, max: 65535 }, 'a port from 0 to 65535 (0: any free port)');
/** top-k sampling: -1 is off; 0 is refused, as SGLang (and vLLM before 0.8) refuse it in every request. */
export const topK = (): NumberParser => {
  const expected = '-1 (off) or a positive integer';
  const k = numberParser('an integer', { min: -1 }, expected);
  const parse = (value: string): number => {
    const x = k(value);
    if (x === 0) throw new InvalidArgumentError(`Expected ${expected}.`);
    return x;
  };
  return Object.assign(parse, { expected });
};
/** A sampling or initialisation seed (what every engine and torch take). */
export const seed = (): NumberParser => nonNegativeInt(2 ** 31 - 1);

/**
 * A comma-separated list, repeatable (`--engines a,b --engines c` is [a, b, c]); an empty item is refused.
 * The one list syntax for names and specs; lists of files stay variadic (`--corpus a.txt b.txt`), where a
 * shell glob expands to separate words.
 */
export function commaList(value: string, previous: string[] | undefined): string[] {
  const items = value.split(',').map((s) => s.trim());
  if (items.some((s) => s === '')) throw new InvalidArgumentError('Expected a comma-separated list (a,b,c).');
  return [...(previous ?? []), ...items];
}

/** A hidden old name for an option: parsed by the new option's parser and stored under its attribute. */
export class AliasOption extends Option {
  constructor(
    flags: string,
    readonly target: Option,
  ) {
    super(flags);
    this.hideHelp();
    if (target.parseArg) this.argParser(target.parseArg);
  }

  override attributeName(): string {
    return this.target.attributeName();
  }
}

/** 'rollout', 'sandbox serve': a command's words after `rstar2`. */
export function commandPath(cmd: Command): string {
  const words: string[] = [];
  for (let c: Command | null = cmd; c?.parent; c = c.parent) words.unshift(c.name());
  return words.join(' ');
}

/**
 * Keeps old option names working for one release, e.g. `{ '--n <k>': '--samples' }`: each old name is a hidden
 * option of `cmd` that sets the new one (the later of the two on a command line wins, as for a repeated
 * option) and writes `rstar2 CMD: --n is deprecated ...; use --samples` to stderr when used.
 */
export function deprecatedAliases(cmd: Command, aliases: Record<string, string>): Command {
  for (const [oldFlags, newFlag] of Object.entries(aliases)) {
    const target = cmd.options.find((o) => o.long === newFlag);
    if (!target)
      throw new Error(`rstar2 ${commandPath(cmd)}: no option ${newFlag} for the alias ${oldFlags}`);
    const alias = new AliasOption(oldFlags, target);
    cmd.addOption(alias);
    let noted = false; // once: a variadic alias (`--engine a b`) reports each value as a use
    cmd.on(`option:${alias.name()}`, () => {
      if (noted) return;
      noted = true;
      const note = `rstar2 ${commandPath(cmd)}: ${alias.long} is deprecated and goes away in the next release; use ${newFlag}\n`;
      (cmd.configureOutput().writeErr ?? ((s: string) => process.stderr.write(s)))(note);
    });
  }
  return cmd;
}
