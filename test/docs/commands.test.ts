// Every command in README.md and docs/*.md is checked, so the docs cannot rot (issue 54 item 5). Each `rstar2 …`
// line of a ```bash or ```sh block is parsed by the real commander program (the command, each option and each
// value must be what it takes). The ones that name only things that exist also run: `train` with --dry-run,
// `data inspect`, `env` and `eval --list-benchmarks` as written, and every other command with --help. Lines with a
// placeholder (DIR, FILE, a file that is not in the checkout) are parsed only. Other commands must name a script or
// file that exists. A ```yaml block with `stages:` must be a valid recipe, and the README's reward module must
// score as it says.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { pathToFileURL } from 'node:url';
import { type Command, CommanderError } from 'commander';
import YAML from 'yaml';
import { buildProgram } from '../../src/cli/program.js';
import { parseRecipe } from '../../src/recipe/config.js';

const ROOT = join(import.meta.dirname, '../..');
const DOCS = [
  'README.md',
  ...readdirSync(join(ROOT, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
];

interface Block {
  file: string;
  lang: string;
  text: string;
}

function blocks(file: string): Block[] {
  const md = readFileSync(join(ROOT, file), 'utf8');
  return [...md.matchAll(/^```(\w*)\n([\s\S]*?)^```/gm)].map((m) => ({ file, lang: m[1], text: m[2] }));
}

/** Shell words of one command: quotes removed, a `# comment` dropped. */
export function shellWords(line: string): string[] {
  const words: string[] = [];
  let cur = '';
  let quote: string | null = null;
  let inWord = false;
  for (const ch of line) {
    if (quote) {
      if (ch === quote) quote = null;
      else cur += ch;
    } else if (ch === "'" || ch === '"') {
      quote = ch;
      inWord = true;
    } else if (ch === '#' && !inWord) break;
    else if (/\s/.test(ch)) {
      if (inWord) words.push(cur);
      cur = '';
      inWord = false;
    } else {
      cur += ch;
      inWord = true;
    }
  }
  if (quote) throw new Error(`unclosed quote in: ${line}`);
  if (inWord) words.push(cur);
  return words;
}

interface Cmd {
  where: string;
  words: string[];
}

/** The commands of a shell block: continuation lines joined, `&&` chains split. */
function commands(b: Block): Cmd[] {
  const out: Cmd[] = [];
  for (const line of b.text.replace(/\\\n/g, ' ').split('\n')) {
    if (!line.trim() || line.trim().startsWith('#')) continue;
    for (const part of line.split('&&')) {
      const words = shellWords(part);
      if (words.length) out.push({ where: `${b.file}: ${part.trim()}`, words });
    }
  }
  return out;
}

const ALL = DOCS.flatMap(blocks);
const SHELL = ALL.filter((b) => b.lang === 'bash' || b.lang === 'sh').flatMap(commands);

/** The rstar2 arguments of a command (`rstar2 …`, `node bin/rstar2.js …`, `npm run rstar2 -- …`), or null. */
function rstar2Args(words: string[]): string[] | null {
  if (words[0] === 'rstar2') return words.slice(1);
  if (words[0] === 'node' && words[1] === 'bin/rstar2.js') return words.slice(2);
  return null;
}

const PLACEHOLDER = /\b(DIR|FILES?|NAME|CKPT|RUN|URL|ADDR|PORT|TEXT|SFT|TRAIN|K|N)\b/;
const PATHLIKE = /\/|\.(jsonl|parquet|ya?ml|json|py|mjs|js|md)$/;

/** Whether a command names only things that exist here (no placeholder, no missing file, no glob). */
function concrete(args: string[]): boolean {
  return args.every((a) => {
    const value = a.includes('=') && !a.startsWith('--') ? a.slice(a.indexOf('=') + 1) : a;
    if (PLACEHOLDER.test(value) || value.includes('*')) return false;
    if (value.startsWith('-') || /^[a-z]+\+?https?:/.test(value) || /^https?:/.test(value)) return true;
    return !PATHLIKE.test(value) || existsSync(join(ROOT, value));
  });
}

function walk(c: Command): Command[] {
  return [c, ...c.commands.flatMap(walk)];
}

/** Parses `rstar2 ARGS` with the real program; no action runs. Returns the command path. */
async function parse(args: string[]): Promise<string> {
  const program = buildProgram();
  let ran = '';
  let stderr = '';
  for (const c of walk(program)) {
    c.exitOverride().configureOutput({ writeOut: () => {}, writeErr: (s) => void (stderr += s) });
    if (c.commands.length === 0)
      c.action(function (this: Command) {
        const names: string[] = [];
        for (let x: Command | null = this; x?.parent; x = x.parent) names.unshift(x.name());
        ran = names.join(' ');
      });
  }
  try {
    await program.parseAsync(args, { from: 'user' });
  } catch (e) {
    if (e instanceof CommanderError) throw new Error(`${e.message}${stderr ? `\n${stderr}` : ''}`);
    throw e;
  }
  if (!ran) throw new Error('no command ran');
  return ran;
}

/** What the doc's command runs as here: its own words for cheap commands, with --dry-run for train, else --help. */
function runnable(path: string, args: string[]): string[] {
  if (path === 'train')
    return args.includes('--dry-run') || args.includes('--print-config') ? args : [...args, '--dry-run'];
  if (path === 'data inspect' || path === 'env' || (path === 'eval' && args.includes('--list-benchmarks')))
    return args;
  return [...path.split(' '), '--help'];
}

test('every relative link and image in the docs points to a file that exists', () => {
  const bad: string[] = [];
  for (const file of DOCS) {
    const md = readFileSync(join(ROOT, file), 'utf8');
    for (const m of md.matchAll(/\]\(([^)#\s]+)(#[^)]*)?\)/g)) {
      const target = m[1];
      if (/^[a-z]+:/.test(target)) continue;
      if (!existsSync(join(ROOT, dirname(file), target))) bad.push(`${file}: ${target}`);
    }
  }
  assert.deepEqual(bad, []);
});

test('the README stays a page: at most 200 lines', () => {
  assert.ok(readFileSync(join(ROOT, 'README.md'), 'utf8').split('\n').length <= 200);
});

test('the docs have commands to check', () => {
  assert.ok(
    SHELL.filter((c) => rstar2Args(c.words)).length >= 20,
    'fewer rstar2 commands than the docs hold',
  );
  assert.ok(DOCS.includes('docs/RECIPES.md'));
});

test('every rstar2 command in the docs parses: its command, options and values are what the CLI takes', async () => {
  const bad: string[] = [];
  for (const c of SHELL) {
    const args = rstar2Args(c.words);
    if (!args) continue;
    try {
      await parse(args);
    } catch (e) {
      bad.push(`${c.where}\n    ${(e as Error).message.split('\n')[0]}`);
    }
  }
  assert.deepEqual(bad, []);
});

test('every rstar2 command in the docs that names real things runs (train as --dry-run, the rest with --help where it would start work)', {
  timeout: 540_000,
}, async () => {
  const bad: string[] = [];
  const ran = new Set<string>();
  for (const c of SHELL) {
    const args = rstar2Args(c.words);
    if (!args || !concrete(args)) continue;
    const run = runnable(await parse(args), args);
    const key = run.join(' ');
    if (ran.has(key)) continue;
    ran.add(key);
    // from the checkout's root, where the docs' relative paths (data/samples/…) point; a dry run writes nothing
    const r = spawnSync(process.execPath, [join(ROOT, 'bin/rstar2.js'), ...run], {
      cwd: ROOT,
      encoding: 'utf8',
      timeout: 120_000,
    });
    if (r.status !== 0)
      bad.push(
        `${c.where}\n    ran: rstar2 ${key}\n    exit ${r.status ?? r.signal}: ${(r.stderr || r.stdout).trim().split('\n').slice(-3).join(' | ')}`,
      );
  }
  assert.ok(ran.size >= 5, `only ${ran.size} commands ran`);
  assert.deepEqual(bad, []);
});

test('every other command in the docs names a script, file or npm script that exists', () => {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
    scripts: Record<string, string>;
  };
  const bad: string[] = [];
  for (const c of SHELL) {
    const [w0, w1, w2] = c.words;
    if (rstar2Args(c.words)) continue;
    const file =
      w0 === 'bash' || (w0 === 'node' && w1 !== '--import') ? w1 : w0 === 'npx' && w1 === 'tsx' ? w2 : null;
    if (file && !existsSync(join(ROOT, file))) bad.push(`${c.where}: no ${file}`);
    if (w0 === 'npm' && w1 === 'run' && !pkg.scripts[w2]) bad.push(`${c.where}: no npm script ${w2}`);
    if (w0 === 'npm' && w1 === 'test' && !pkg.scripts.test) bad.push(`${c.where}: no npm test`);
  }
  assert.deepEqual(bad, []);
});

test('every recipe written out in the docs (a yaml block with stages) is valid', () => {
  const recipes = ALL.filter((b) => b.lang === 'yaml' && /^stages:/m.test(b.text));
  assert.ok(recipes.length >= 1);
  for (const b of recipes) assert.doesNotThrow(() => parseRecipe(YAML.parse(b.text), b.file), b.file);
});

test("the README's reward module scores as it says", async () => {
  const js = ALL.find((b) => b.file === 'README.md' && b.lang === 'js' && b.text.includes('export default'));
  assert.ok(js, 'the README shows a reward module');
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-docs-'));
  try {
    writeFileSync(join(dir, 'reward.mjs'), js.text);
    const score = (await import(pathToFileURL(join(dir, 'reward.mjs')).href)).default;
    assert.equal(score({ text: 'so \\boxed{7}', gold: '7', row: {} }).reward, 1);
    assert.equal(score({ text: 'so \\boxed{8}', gold: '7', row: {} }).reward, 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('shellWords: quotes and comments', () => {
  assert.deepEqual(shellWords(`rstar2 train --set data.train='train-*.parquet' # a note`), [
    'rstar2',
    'train',
    '--set',
    'data.train=train-*.parquet',
  ]);
  assert.deepEqual(shellWords('rstar2 chat --prompt "What is 468*69?"'), [
    'rstar2',
    'chat',
    '--prompt',
    'What is 468*69?',
  ]);
});
