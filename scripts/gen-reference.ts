// Writes docs/reference/recipe.md (every recipe key from the zod schema: type, default, meaning, the verl key
// docs/VERL.md maps to it) and docs/reference/cli.md (every command and option of buildProgram()).
// Usage: npm run docs   (test/docs/reference.test.ts fails when either file is not what this writes)
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Command, Option } from 'commander';
import type { z } from 'zod';
import { buildProgram } from '../src/cli/program.js';
import { RecipeSchema } from '../src/recipe/config.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
export const RECIPE_REF = join(ROOT, 'docs/reference/recipe.md');
export const CLI_REF = join(ROOT, 'docs/reference/cli.md');
const VERL_MD = join(ROOT, 'docs/VERL.md');

type Def = {
  type: string;
  innerType?: z.ZodType;
  in?: z.ZodType;
  out?: z.ZodType;
  element?: z.ZodType;
  options?: z.ZodType[];
  entries?: Record<string, string>;
  values?: unknown[];
  checks?: { _zod: { def: Record<string, unknown> } }[];
  shape?: Record<string, z.ZodType>;
};
const defOf = (s: z.ZodType) => s.def as unknown as Def;

/** The schema under default/nullable/optional/preprocess wrappers, whether null is allowed, and the first description met. */
function unwrap(s: z.ZodType): { core: z.ZodType; nullable: boolean; description?: string } {
  let nullable = false;
  let description: string | undefined;
  for (let i = 0; i < 16; i++) {
    description ??= s.description;
    const d = defOf(s);
    if (d.type === 'nullable') nullable = true;
    if (d.type === 'default' || d.type === 'nullable' || d.type === 'optional' || d.type === 'prefault')
      s = d.innerType as z.ZodType;
    // a preprocess is pipe(transform, schema); a transform after a schema is pipe(schema, transform)
    else if (d.type === 'pipe')
      s = (defOf(d.in as z.ZodType).type === 'transform' ? d.out : d.in) as z.ZodType;
    else break;
  }
  return { core: s, nullable, description };
}

function bounds(d: Def): string {
  const out: string[] = [];
  for (const c of d.checks ?? []) {
    const k = c._zod.def;
    if (k.check === 'greater_than') out.push(`${k.inclusive ? '≥' : '>'} ${k.value}`);
    if (k.check === 'less_than') out.push(`${k.inclusive ? '≤' : '<'} ${k.value}`);
    if (k.check === 'min_length') out.push(`(at least ${k.minimum})`);
  }
  return out.length ? ` ${out.join(', ')}` : '';
}

function typeName(s: z.ZodType): string {
  const { core, nullable } = unwrap(s);
  const d = defOf(core);
  let t: string;
  if (d.type === 'number') {
    const int = d.checks?.some((c) => c._zod.def.check === 'number_format');
    t = `${int ? 'integer' : 'number'}${bounds(d)}`;
  } else if (d.type === 'enum')
    t = Object.values(d.entries ?? {})
      .map((v) => `\`${v}\``)
      .join(' \\| ');
  else if (d.type === 'literal') t = (d.values ?? []).map((v) => `\`${v}\``).join(' \\| ');
  else if (d.type === 'array') t = `list of ${typeName(d.element as z.ZodType)}${bounds(d)}`;
  else if (d.type === 'union') t = (d.options ?? []).map(typeName).join(' or ');
  else if (d.type === 'record') t = 'object';
  else if (d.type === 'object') t = 'section';
  else t = d.type;
  return nullable ? `${t} or null` : t;
}

/** A key's own default, for keys inside a section whose default is null (an SFT stage's gate); else 'required'. */
function ownDefault(s: z.ZodType): unknown {
  for (let i = 0; i < 16; i++) {
    const d = s.def as unknown as { type: string; innerType?: z.ZodType; defaultValue?: unknown };
    if (d.type === 'default') return d.defaultValue;
    if (d.type === 'nullable' || d.type === 'optional') return undefined;
    if (!d.innerType) break;
    s = d.innerType;
  }
  return 'required';
}

interface Key {
  path: string;
  type: string;
  default: unknown;
  description?: string;
}

/** Every leaf below an object schema, with the value parsing gave it (`value`: the parsed section). */
function leaves(schema: z.ZodType, value: unknown, prefix: string): Key[] {
  const { core } = unwrap(schema);
  const shape = (core as unknown as { shape?: Record<string, z.ZodType> }).shape ?? {};
  const keys: Key[] = [];
  for (const [name, field] of Object.entries(shape)) {
    const path = prefix ? `${prefix}.${name}` : name;
    const v = (value as Record<string, unknown> | undefined)?.[name];
    const u = unwrap(field);
    const inner = defOf(u.core).type;
    // a section with its own keys is listed key by key; stages are their own tables
    if (inner === 'object' && name !== 'demoMix') {
      if (u.description)
        keys.push({
          path,
          type: u.nullable ? 'section or null' : 'section',
          default: u.nullable ? v : undefined,
          description: u.description,
        });
      keys.push(...leaves(u.core, v ?? undefined, path));
    } else
      keys.push({
        path,
        type: typeName(field),
        default: value === undefined || value === null ? ownDefault(field) : v,
        description: u.description,
      });
  }
  return keys;
}

const STAGE_TYPES = ['sft', 'rl'] as const;

function stageSchema(type: (typeof STAGE_TYPES)[number]): z.ZodType {
  const stages = unwrap((RecipeSchema.shape as Record<string, z.ZodType>).stages).core;
  const union = defOf(stages).element as z.ZodType;
  const opt = (defOf(union).options ?? []).find(
    (o) => (defOf((defOf(o).shape as Record<string, z.ZodType>).type).values ?? [])[0] === type,
  );
  if (!opt) throw new Error(`no ${type} stage in the recipe schema`);
  return opt;
}

/** The recipe's keys: top level (stages aside), then an SFT stage's, then an RL stage's. */
export function recipeKeys(): { top: Key[]; sft: Key[]; rl: Key[] } {
  const parsed = RecipeSchema.parse({ stages: [{ type: 'sft' }, { type: 'rl' }] });
  const top = leaves(RecipeSchema, parsed, '').filter((k) => k.path !== 'stages');
  return {
    top,
    sft: leaves(stageSchema('sft'), parsed.stages[0], '').filter((k) => k.path !== 'type'),
    rl: leaves(stageSchema('rl'), parsed.stages[1], '').filter((k) => k.path !== 'type'),
  };
}

/** `a.b.c`, `.d` → `a.b.d`: a name after a dotted one in the same cell is its sibling. */
function expandSiblings(names: string[]): string[] {
  let parent = '';
  return names.map((n) => {
    const full = n.startsWith('.') ? parent + n.slice(1) : !n.includes('.') && parent ? parent + n : n;
    parent = full.includes('.') ? full.slice(0, full.lastIndexOf('.') + 1) : parent;
    return full;
  });
}

/** The backticked names of a table cell, leaving out values in brackets or parentheses. */
function cellNames(cell: string): string[] {
  const plain = cell.replace(/\[[^\]]*\]/g, '').replace(/\([^)]*\)/g, '');
  return [...plain.matchAll(/`([^`]+)`/g)]
    .map((m) => /^\.?[\w.*]+/.exec(m[1])?.[0] ?? '')
    .filter((n) => n && !n.startsWith('-'));
}

/**
 * docs/VERL.md's table read back: each recipe key (`stages.*.x` as `stage.x`) to the verl keys of its row,
 * paired in order where a row names as many of each.
 */
export function verlMap(md = readFileSync(VERL_MD, 'utf8')): Map<string, string[]> {
  const map = new Map<string, string[]>();
  for (const line of md.split('\n')) {
    const cells = line.split(/(?<!\\)\|/).map((c) => c.trim());
    if (cells.length < 4 || !line.startsWith('|') || /^-+$/.test(cells[1]) || cells[1] === 'verl') continue;
    const verl = expandSiblings(cellNames(cells[1]));
    const ours = expandSiblings(cellNames(cells[2])).map((p) => p.replace(/^stages\.[^.]+\./, 'stage.'));
    for (const [i, key] of ours.entries()) {
      const from = verl.length === ours.length ? [verl[i]] : verl;
      map.set(key, [...(map.get(key) ?? []), ...from]);
    }
  }
  return map;
}

const cell = (s: string) => s.replace(/\|/g, '\\|').replace(/\n/g, ' ');

function shown(v: unknown): string {
  if (v === undefined) return '';
  if (v === 'required') return 'required';
  return `\`${JSON.stringify(v).replace(/\|/g, '\\|')}\``;
}

function verlFor(map: Map<string, string[]>, key: string): string {
  const names = map.get(key) ?? [];
  // a section named with `.*` (sandbox.*) stands for each key in it
  for (const [k, v] of map) if (k.endsWith('.*') && key.startsWith(k.slice(0, -1))) names.push(...v);
  return [...new Set(names)].map((n) => `\`${n}\``).join(', ');
}

function table(keys: Key[], map: Map<string, string[]>, verlKey: (k: Key) => string): string[] {
  const rows = ['| key | type | default | meaning | verl |', '|---|---|---|---|---|'];
  for (const k of keys)
    rows.push(
      `| \`${k.path}\` | ${k.type} | ${shown(k.default)} | ${cell(k.description ?? '')} | ${verlFor(map, verlKey(k))} |`,
    );
  return rows;
}

/** Keys whose meaning the schema does not give (a `.describe()` is missing). */
export function undescribed(): string[] {
  const { top, sft, rl } = recipeKeys();
  return [
    ...top.map((k) => [k.path, k] as const),
    ...sft.map((k) => [`stages[sft].${k.path}`, k] as const),
    ...rl.map((k) => [`stages[rl].${k.path}`, k] as const),
  ]
    .filter(([, k]) => !k.description)
    .map(([p]) => p);
}

export function renderRecipeReference(): string {
  const { top, sft, rl } = recipeKeys();
  const map = verlMap();
  return [
    '# Recipe reference',
    '',
    '<!-- Generated by `npm run docs` (scripts/gen-reference.ts) from the zod schema in src/recipe/config.ts and',
    '     the table in docs/VERL.md; do not edit by hand. test/docs/reference.test.ts fails when it is out of date. -->',
    '',
    'Every key of a recipe (`data/recipes/*.yaml`, or a file of your own), with its type, its default, what it does',
    'and the verl key docs/VERL.md maps to it. Set any of them from the command line with `--set path=value`',
    "(values as YAML; stages by name, index or `*`: `--set 'stages.*.lr=1e-6'`), and print a recipe with every",
    'default filled in with `rstar2 train --recipe NAME --print-config`. The guide is docs/RECIPES.md.',
    '',
    '## Top level',
    '',
    ...table(top, map, (k) => k.path),
    '',
    '## `stages`: a list of SFT and RL stages, run in order',
    '',
    'Each stage has `type: sft` or `type: rl`. Address a stage as `stages.NAME.key`, `stages.INDEX.key`, or',
    '`stages.*.key` (every stage whose type has the key).',
    '',
    '### An SFT stage (`type: sft`)',
    '',
    ...table(sft, map, (k) => `stage.${k.path}`),
    '',
    '### An RL stage (`type: rl`): GRPO-RoC',
    '',
    ...table(rl, map, (k) => `stage.${k.path}`),
    '',
  ].join('\n');
}

const isHidden = (o: Option) => (o as Option & { hidden?: boolean }).hidden === true;

function commandName(c: Command): string {
  const names: string[] = [];
  for (let x: Command | null = c; x; x = x.parent) names.unshift(x.name());
  return names.join(' ');
}

function usage(c: Command): string {
  const args = c.registeredArguments.map((a) => {
    const n = `${a.name()}${a.variadic ? '...' : ''}`;
    return a.required ? `<${n}>` : `[${n}]`;
  });
  return [commandName(c), c.options.some((o) => !isHidden(o)) ? '[options]' : '', ...args]
    .filter(Boolean)
    .join(' ');
}

function commandSection(c: Command): string[] {
  const out = [`## \`${commandName(c)}\``, '', cell(c.description()), '', '```', usage(c), '```', ''];
  const args = c.registeredArguments.filter((a) => a.description);
  if (args.length) {
    out.push('| argument | meaning |', '|---|---|');
    for (const a of args) out.push(`| \`${a.name()}\` | ${cell(a.description)} |`);
    out.push('');
  }
  const opts = c.options.filter((o) => !isHidden(o));
  if (opts.length) {
    out.push('| option | meaning | default |', '|---|---|---|');
    for (const o of opts) {
      const choices = o.argChoices ? ` (one of ${o.argChoices.map((x) => `\`${x}\``).join(', ')})` : '';
      // a negatable --no-x's default is only commander's own `true`
      const dflt = o.negate || o.defaultValue === undefined ? '' : shown(o.defaultValue);
      out.push(`| \`${cell(o.flags)}\` | ${cell(o.description)}${choices} | ${dflt} |`);
    }
    out.push('');
  }
  return out;
}

function walk(c: Command): Command[] {
  return [c, ...c.commands.flatMap(walk)];
}

export function renderCliReference(): string {
  const program = buildProgram();
  const commands = walk(program).filter((c) => c !== program && c.commands.length === 0);
  return [
    '# Command reference',
    '',
    '<!-- Generated by `npm run docs` (scripts/gen-reference.ts) from the commander program (src/cli/program.ts,',
    '     buildProgram); do not edit by hand. test/docs/reference.test.ts fails when it is out of date. -->',
    '',
    'Every `rstar2` command and option, as `rstar2 COMMAND --help` prints them. In a checkout, `rstar2` is',
    '`node bin/rstar2.js` (or `npm run rstar2 --`).',
    '',
    ...commands.map((c) => `- [\`${commandName(c)}\`](#${commandName(c).replace(/ /g, '-')})`),
    '',
    ...commands.flatMap(commandSection),
  ].join('\n');
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const missing = undescribed();
  if (missing.length) {
    console.error(
      `gen-reference: these recipe keys have no meaning in src/recipe/config.ts; add a .describe('…') to each:\n  ${missing.join('\n  ')}`,
    );
    process.exit(1);
  }
  mkdirSync(dirname(RECIPE_REF), { recursive: true });
  writeFileSync(RECIPE_REF, renderRecipeReference());
  writeFileSync(CLI_REF, renderCliReference());
  console.log(`wrote ${RECIPE_REF} and ${CLI_REF}`);
}
