// The CLI's one vocabulary (docs/DECISIONS.md, "cli"), checked on the commander program itself, in process:
// every command is built by its register function and parsed without running its action.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { type Command, CommanderError, type Option } from 'commander';
import { AliasOption, commaList, commandPath, type NumberParser } from '../../src/cli/options.js';
import { buildProgram } from '../../src/cli/program.js';

function walk(cmd: Command): Command[] {
  return [cmd, ...cmd.commands.flatMap(walk)];
}

const numberParser = (o: Option) => o.parseArg as NumberParser | undefined;

interface Parsed {
  path: string;
  opts: Record<string, unknown>;
  stderr: string;
}

/** Parses `args` like `rstar2 ARGS` would, but an action only records its command's options. */
async function parse(args: string[]): Promise<Parsed> {
  const program = buildProgram();
  let stderr = '';
  let ran: { path: string; opts: Record<string, unknown> } | undefined;
  for (const c of walk(program)) {
    c.exitOverride().configureOutput({ writeOut: () => {}, writeErr: (s) => void (stderr += s) });
    if (c.commands.length === 0)
      c.action(function (this: Command) {
        ran = { path: commandPath(this), opts: this.opts() };
      });
  }
  try {
    await program.parseAsync(args, { from: 'user' });
  } catch (e) {
    if (e instanceof CommanderError) Object.assign(e, { stderr });
    throw e;
  }
  assert.ok(ran, `no command ran for ${args.join(' ')}`);
  return { ...ran, stderr };
}

const program = buildProgram();
const commands = walk(program);
const leaves = commands.filter((c) => c.commands.length === 0);

test('every numeric option of every command refuses a bad value, naming the option, the value and what it expects', async () => {
  const covered = new Set<string>();
  for (const c of leaves) {
    for (const o of c.options) {
      const p = numberParser(o);
      if (!p?.expected) continue;
      covered.add(commandPath(c));
      for (const bad of ['abc', '1e400']) {
        const args = [...commandPath(c).split(' '), o.long as string, bad];
        await assert.rejects(parse(args), (e: unknown) => {
          assert.ok(e instanceof CommanderError, String(e));
          assert.equal(e.code, 'commander.invalidArgument', args.join(' '));
          assert.equal(e.exitCode, 1);
          assert.equal(
            e.message,
            `error: option '${o.flags}' argument '${bad}' is invalid. Expected ${p.expected}.`,
          );
          return true;
        });
      }
    }
  }
  // the commands that take numbers; one whose options are all strings has nothing to check
  assert.deepEqual([...covered].sort(), [
    'chat',
    'dashboard',
    'data inspect',
    'eval',
    'model init',
    'plan',
    'rollout',
    'sandbox run',
    'sandbox serve',
    'sandbox worker',
    'serve',
    'tokenizer build',
    'train',
    'verify',
  ]);
});

test('an option whose value is a number (<n>, <k>, <ms>, <mb>, <port>, ...) is parsed as one, with a number default', () => {
  const NUMERIC = /<(n|k|ms|mb|port|t|p|x|tokens)>$/;
  for (const c of leaves) {
    for (const o of c.options) {
      const where = `rstar2 ${commandPath(c)} ${o.flags}`;
      if (NUMERIC.test(o.flags)) assert.ok(numberParser(o)?.expected, `${where}: no numeric parser`);
      if (numberParser(o)?.expected && o.defaultValue !== undefined)
        assert.equal(typeof o.defaultValue, 'number', `${where}: default ${JSON.stringify(o.defaultValue)}`);
    }
  }
});

test('one name, one parser: an option name shared by commands accepts the same values everywhere', () => {
  const kind = (o: Option) =>
    numberParser(o)?.expected ??
    (o.parseArg === commaList ? 'a comma list' : o.parseArg ? 'custom' : 'a string');
  const seen = new Map<string, { where: string; kind: string }>();
  for (const c of leaves) {
    for (const o of c.options) {
      if (o instanceof AliasOption) continue;
      const where = `rstar2 ${commandPath(c)}`;
      const first = seen.get(o.long as string);
      if (first) assert.equal(kind(o), first.kind, `${o.long}: ${where} vs ${first.where}`);
      else seen.set(o.long as string, { where, kind: kind(o) });
    }
  }
  for (const name of ['--engines', '--logger', '--preload'])
    assert.equal(seen.get(name)?.kind, 'a comma list', name);
});

// Every old name: [command, its required arguments, the old name in use, the new option's attribute, value].
const ALIASES: [string, string[], string[], string, unknown][] = [
  [
    'rollout',
    ['--data', 'p.jsonl', '--out', 't.jsonl'],
    ['--engine', 'fake', 'sglang+http://h:1'],
    'engines',
    ['fake', 'sglang+http://h:1'],
  ],
  ['rollout', ['--engines', 'fake', '--data', 'p.jsonl', '--out', 't.jsonl'], ['--n', '4'], 'samples', 4],
  ['eval', [], ['--k', '4'], 'samples', 4],
  ['eval', [], ['--max-tokens', '99'], 'maxResponseTokens', 99],
  ['chat', [], ['--max-tokens', '99'], 'maxResponseTokens', 99],
  ['train', [], ['--backend', 'fake'], 'policyBackend', 'fake'],
  ['verify', ['x.jsonl'], ['--profile', 'lenient'], 'verifyProfile', 'lenient'],
];

test('every old option name still works: it sets the new option and says once on stderr that it is deprecated', async () => {
  const declared = leaves.flatMap((c) =>
    c.options.filter((o) => o instanceof AliasOption).map((o) => `${commandPath(c)} ${o.long}`),
  );
  assert.deepEqual(declared.sort(), ALIASES.map(([cmd, , old]) => `${cmd} ${old[0]}`).sort());
  for (const [cmd, base, old, attr, value] of ALIASES) {
    const target = leaves
      .find((c) => commandPath(c) === cmd)
      ?.options.find((o) => o instanceof AliasOption && o.long === old[0]) as AliasOption;
    const r = await parse([cmd, ...base, ...old]);
    assert.deepEqual(r.opts[attr], value, `${cmd} ${old.join(' ')}`);
    assert.equal(r.opts[old[0].slice(2)], undefined, `${cmd}: ${old[0]} left a value of its own`);
    assert.equal(
      r.stderr,
      `rstar2 ${cmd}: ${old[0]} is deprecated and goes away in the next release; use ${target.target.long}\n`,
    );
    // the new name: same value, no note
    const fresh = await parse([
      cmd,
      ...base,
      target.target.long as string,
      ...old.slice(1).join(',').split(' '),
    ]);
    assert.deepEqual(fresh.opts[attr], value);
    assert.equal(fresh.stderr, '');
  }
  // a numeric old name checks its value like the new one, and names what was typed
  await assert.rejects(parse(['eval', '--k', 'lots']), {
    message: "error: option '--k <k>' argument 'lots' is invalid. Expected a positive integer.",
  });
  // old and new together: the later wins, as for a repeated option
  assert.equal((await parse(['eval', '--k', '2', '-n', '3'])).opts.samples, 3);
  assert.equal((await parse(['eval', '--samples', '2', '--k', '3'])).opts.samples, 3);
  // lists add up across old and new names
  const both = await parse(['rollout', '--engines', 'a,b', '--data', 'p', '--out', 't', '--engine', 'c']);
  assert.deepEqual(both.opts.engines, ['a', 'b', 'c']);
});

test('no --help lists a hidden old name, and the retired names are visible nowhere', () => {
  const retired = ['--n', '--k', '--max-tokens', '--profile'];
  for (const c of commands) {
    const help = c.helpInformation();
    const listed = [...help.matchAll(/^ {2}(?:-\w, )?(--[\w-]+)/gm)].map((m) => m[1]);
    for (const o of c.options.filter((x) => x instanceof AliasOption))
      assert.ok(!listed.includes(o.long as string), `rstar2 ${commandPath(c)} --help lists ${o.long}`);
    for (const name of retired)
      assert.ok(!listed.includes(name), `rstar2 ${commandPath(c)} --help lists ${name}`);
    // what --help lists is exactly the visible options (and --help itself)
    const visible = c.options.filter((o) => !o.hidden).map((o) => o.long);
    assert.deepEqual(listed, [...visible, ...(listed.includes('--help') ? ['--help'] : [])], commandPath(c));
  }
  // --backend names an engine kind only; train's policy backend has its own name
  const train = leaves.find((c) => commandPath(c) === 'train') as Command;
  assert.ok(train.options.find((o) => o.long === '--backend')?.hidden);
});

test('sandbox serve says it serves code-judge routes and SandboxFusion /run_code', () => {
  const serve = leaves.find((c) => commandPath(c) === 'sandbox serve') as Command;
  assert.match(serve.description(), /code-judge-compatible routes/);
  assert.match(serve.description(), /SandboxFusion's \/run_code/);
});

// Two real processes, for what only they show: the exit code and what reaches the terminal.
const bin = join(import.meta.dirname, '../../bin/rstar2.js');
const rstar2 = (...args: string[]) =>
  spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', timeout: 60_000 });

test('rstar2 verify --workers abc: exit 1 with a one-line reason, nothing on stdout', () => {
  const file = join(mkdtempSync(join(tmpdir(), 'rstar2-cli-')), 'v.jsonl');
  writeFileSync(file, '{"pred": "\\\\boxed{2}", "gold": "2"}\n');
  const r = rstar2('verify', file, '--workers', 'abc');
  assert.equal(r.status, 1, r.stderr);
  assert.equal(r.stdout, '');
  assert.equal(
    r.stderr,
    "error: option '--workers <n>' argument 'abc' is invalid. Expected a positive integer.\n" +
      "(run with --help for the command's options)\n",
  );
});

test('rstar2 rollout with old names: works (exit 0), one deprecation line per old name', () => {
  const r = rstar2(
    'rollout',
    '--engine',
    'fake',
    '--data',
    'p.jsonl',
    '--out',
    't.jsonl',
    '--n',
    '3',
    '--print-config',
  );
  assert.equal(r.status, 0, r.stderr);
  const cfg = JSON.parse(r.stdout);
  assert.deepEqual(cfg.engines, ['fake']);
  assert.equal(cfg.n, 3);
  assert.deepEqual(r.stderr.trim().split('\n'), [
    'rstar2 rollout: --engine is deprecated and goes away in the next release; use --engines',
    'rstar2 rollout: --n is deprecated and goes away in the next release; use --samples',
  ]);
});

test('rstar2 verify | head -1: the reader closing the pipe early ends the command quietly', () => {
  const file = join(mkdtempSync(join(tmpdir(), 'rstar2-cli-')), 'v.jsonl');
  // enough lines that the writer is still writing when head has gone
  writeFileSync(file, '{"pred": "\\\\boxed{2}", "gold": "2"}\n'.repeat(20_000));
  const r = spawnSync('sh', ['-c', `"${process.execPath}" "${bin}" verify "${file}" | head -1`], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  assert.equal(r.stdout.split('\n').length, 2, r.stdout.slice(0, 200));
  assert.equal(r.stderr, '', 'no stack trace, no EPIPE');
});

test('rstar2 tokenizer build refuses to replace a directory’s tokenizer without --force', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-cli-tok-'));
  assert.equal(rstar2('tokenizer', 'build', '--out', dir).status, 0);
  const again = rstar2('tokenizer', 'build', '--out', dir);
  assert.equal(again.status, 1);
  assert.match(again.stderr, /already holds tokenizer\.json and tokenizer_config\.json \(pass --force/);
  assert.equal(rstar2('tokenizer', 'build', '--out', dir, '--force').status, 0);
});

test('rstar2 train --resume RUN --recipe NAME: refused, the run’s own config.json decides', () => {
  const run = mkdtempSync(join(tmpdir(), 'rstar2-cli-run-'));
  writeFileSync(join(run, 'config.json'), '{}');
  const r = rstar2('train', '--resume', run, '--recipe', 'quickstart');
  assert.equal(r.status, 1);
  assert.match(r.stderr, /--recipe, --roc, --seed and --stages cannot change a run being resumed/);
  // it says what a resume may change, and the way to change the rest
  assert.match(
    r.stderr,
    /--set may change reward\.profile, .* To change anything else, .*rstar2 train --fork /,
  );
});
