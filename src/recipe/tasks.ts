import type { ChatExample, Message, ToolCall } from '../data/index.js';
import { Rng } from '../util/rng.js';

// The quickstart task family: generated math problems with integer answers where running Python helps.
// Each problem carries the one-line program that solves it, written with the problem's own digits, so a
// tiny char-level model can learn to copy digits into print(...) and stdout into \boxed{}, while the
// answers themselves (products, modular powers, digit sums of powers) are out of reach of direct guessing.

export const TASK_KINDS = ['add', 'mul', 'powmod', 'digitsum', 'gcd', 'lcm', 'count'] as const;
export type TaskKind = (typeof TASK_KINDS)[number];

export interface TaskProblem {
  id: string;
  question: string;
  answer: string; // integer, decimal string
  kind: TaskKind;
  level: number; // 0 = small enough to do in one's head, higher = bigger numbers
  code: string; // a Python program that prints the answer
}

export interface ProblemSpec {
  seed: number;
  n: number;
  split: 'train' | 'test';
  levels: number[];
  kinds?: readonly TaskKind[];
  /** One in `testEvery` distinct questions belongs to the test split (default 5). */
  testEvery?: number;
}

export const MAX_LEVEL = 3;

function digits(rng: Rng, d: number): bigint {
  if (d <= 1) return BigInt(rng.int(2, 9));
  return BigInt(rng.int(10 ** (d - 1), 10 ** d - 1));
}

function gcd(a: bigint, b: bigint): bigint {
  while (b) [a, b] = [b, a % b];
  return a;
}

function modPow(b: bigint, e: bigint, m: bigint): bigint {
  let r = 1n;
  b %= m;
  while (e > 0n) {
    if (e & 1n) r = (r * b) % m;
    b = (b * b) % m;
    e >>= 1n;
  }
  return r % m;
}

function digitSum(x: bigint): number {
  return [...x.toString()].reduce((s, c) => s + Number(c), 0);
}

/** Builds one problem of a kind and level from the rng (pure: same rng state, same problem). */
export function makeProblem(kind: TaskKind, level: number, rng: Rng): Omit<TaskProblem, 'id'> {
  const L = Math.max(0, Math.min(MAX_LEVEL, level));
  const q = (question: string, answer: bigint | number, code: string) => ({
    question,
    answer: answer.toString(),
    kind,
    level: L,
    code,
  });
  switch (kind) {
    case 'add': {
      const a = digits(rng, [1, 4, 7, 10][L]);
      const b = digits(rng, [1, 4, 7, 10][L]);
      return q(`What is ${a}+${b}?`, a + b, `print(${a}+${b})`);
    }
    case 'mul': {
      let a: bigint;
      let b: bigint;
      // Level 1 keeps only 5-digit products: with operands and answer of fixed length every copy a solution
      // makes (question -> echo -> print(...), stdout -> \boxed{}) is at one fixed offset, which a tiny
      // model learns reliably; with 4- and 5-digit answers mixed the stdout copy was not learned in 450 steps.
      do {
        a = digits(rng, [1, 3, 5, 7][L]);
        b = digits(rng, [1, 2, 4, 6][L]);
      } while (L === 1 && a * b < 10000n);
      return q(`What is ${a}*${b}?`, a * b, `print(${a}*${b})`);
    }
    case 'powmod': {
      const a = BigInt(rng.int(2, [5, 20, 99, 999][L]));
      const e = BigInt(rng.int(2, [3, 50, 500, 9999][L]));
      const m = BigInt(rng.int(7, [10, 100, 1000, 100000][L]));
      return q(`What is ${a}^${e} mod ${m}?`, modPow(a, e, m), `print(pow(${a},${e},${m}))`);
    }
    case 'digitsum': {
      const a = BigInt(rng.int(2, [3, 9, 20, 99][L]));
      const e = BigInt(rng.int(2, [3, 30, 100, 300][L]));
      return q(`Digit sum of ${a}^${e}?`, digitSum(a ** e), `print(sum(map(int,str(${a}**${e}))))`);
    }
    case 'gcd': {
      const g = BigInt(rng.int(1, [3, 30, 300, 3000][L]));
      const a = g * digits(rng, L + 1);
      const b = g * digits(rng, L + 1);
      return q(`What is gcd(${a},${b})?`, gcd(a, b), `import math;print(math.gcd(${a},${b}))`);
    }
    case 'lcm': {
      const a = digits(rng, L + 1);
      const b = digits(rng, L + 1);
      return q(`What is lcm(${a},${b})?`, (a * b) / gcd(a, b), `import math;print(math.lcm(${a},${b}))`);
    }
    case 'count': {
      const N = rng.int(10, [20, 1000, 100000, 10000000][L]);
      const a = rng.int(2, 9);
      let b = rng.int(2, 13);
      if (b === a) b++;
      const l = (a * b) / Number(gcd(BigInt(a), BigInt(b)));
      const ans = Math.floor(N / a) + Math.floor(N / b) - Math.floor(N / l);
      return q(
        `How many n<=${N} are divisible by ${a} or ${b}?`,
        ans,
        `print(sum(1 for n in range(1,${N + 1}) if n%${a}==0 or n%${b}==0))`,
      );
    }
  }
}

// FNV-1a over the question: the split depends only on the text, so train and test never share a question
// whatever the seeds, counts or levels asked for.
function hash32(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

export function splitOf(question: string, testEvery = 5): 'train' | 'test' {
  return hash32(question) % testEvery === 0 ? 'test' : 'train';
}

/** n distinct problems of one split, deterministic in the spec. */
export function generateProblems(spec: ProblemSpec): TaskProblem[] {
  const kinds = spec.kinds ?? TASK_KINDS;
  if (kinds.length === 0) throw new Error('generateProblems: no task kinds');
  if (spec.levels.length === 0) throw new Error('generateProblems: no levels');
  for (const k of kinds)
    if (!TASK_KINDS.includes(k))
      throw new Error(`unknown task kind "${k}" (known: ${TASK_KINDS.join(', ')})`);
  const rng = new Rng(spec.seed);
  const seen = new Set<string>();
  const out: TaskProblem[] = [];
  for (let tries = 0; out.length < spec.n; tries++) {
    if (tries > spec.n * 200 + 10000)
      throw new Error(`generateProblems: cannot find ${spec.n} distinct ${spec.split} problems`);
    const p = makeProblem(rng.pick(kinds), rng.pick(spec.levels), rng);
    if (seen.has(p.question) || splitOf(p.question, spec.testEvery) !== spec.split) continue;
    seen.add(p.question);
    out.push({ id: `${spec.split}-${spec.seed}-${out.length}`, ...p });
  }
  return out;
}

// ---- SFT demos: format only, as chat examples (data/'s SFT format, rendered by the one SFT path). ----

export type DemoStyle = 'direct' | 'tool' | 'recover';

export const TOOL_NAME = 'python_code_with_standard_io';

// The text rollouts contain, for the fake policy and for tests that compare SFT renders with rollouts.
export function toolCallText(code: string): string {
  return `</reason>\n<tool_call>\n${JSON.stringify({ name: TOOL_NAME, arguments: { code, input: '' } })}\n</tool_call><|im_end|>`;
}

// What the agent loop appends after a tool call, token for token (no newline before <|im_start|>user).
export function toolObservationText(toolText: string): string {
  return `<|im_start|>user\n<tool_response>\n${toolText}\n</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>`;
}

export function answerText(answer: string, thought = ''): string {
  return `${thought}</reason> <answer> \\boxed{${answer}} </answer><|im_end|>`;
}

// Broken variants of a program for recovery demos: each fails the way a careless first attempt does, and the
// observation is the text the sandboxed python tool returns for it (message, then the offending line). The two
// misspellings are the same length, so every text a fixing turn can copy the expression from (the question, the
// first turn, the offending line) sits at one offset before it whichever failure came first: with an unclosed `(`
// as the second kind (4 characters shorter message, the expression 1 nearer the line's end) a tiny model had to
// learn two offsets for one copy, and the quickstart's retry gate missed on 3 of 5 seeds.
function breakCode(code: string, rng: Rng): { code: string; tool: string } {
  const failure = (msg: string, bad: string) => `Tool call failure\nreason: \nstderr: ${msg}\n  ${bad}`;
  const name = rng.pick(['prnt', 'pint']);
  const bad = code.replace('print(', `${name}(`);
  return { code: bad, tool: failure(`NameError at line 1: name '${name}' is not defined`, bad) };
}

// What a fixing turn's reasoning says before it restates the expression (echo demos). Its 9 characters put the
// restatement as far after the offending line's expression as the answer's digits are after `stdout: ` (55 tokens
// with the char tokenizer and the quick template, for the quickstart's 6-character expressions and 5-digit
// answers), and it ends in `{` as `\boxed{` does. So the fix is the copy the first stage has already learned,
// from the same place in the same query context, not a new one. On the 2026-11-27 first-stage checkpoints, without
// a note seeds 4 and 6 found the expression's first digit and repeated it (retry exact 0 at every check); with
// "fix typo " (the offset alone) they passed but seed 1 got the first digit right half the time (its stdout copy
// starts from the `{`); with this note seeds 1, 4 and 6 pass the retry gate at steps 50, 25 and 100.
export const FIX_NOTE = 'fix call{';

export interface DemoMix {
  direct: number;
  tool: number;
  recover: number;
}

export interface DemoOptions {
  /**
   * Open every response by restating the question's expression (`<reason>48213*7719</reason>`): a short-range
   * copy on every demo, so a from-scratch model learns to copy digits early, and then copies them again
   * into print(...). A recovery demo's fixing turn restates it too, so the fixed call is the same fixed-offset
   * copy as a first call, whatever the broken call lacked. Default off (empty reasoning).
   */
  echo?: boolean;
  /** The share of recovery demos whose failing call is trained (default 0: every one is shown, weight 0). */
  trainFailedCalls?: number;
}

/** The question's expression, for echo demos: "What is 12*34?" -> "12*34". */
export function echoOf(question: string): string {
  return question.replace(/^What is /, '').replace(/\?$/, '');
}

/** How many assistant messages of an example call a tool. */
export function toolCalls(ex: ChatExample): number {
  return ex.messages.filter((m) => m.tool_calls?.length).length;
}

/** The style of a demo, read back from its messages (the fake policy and the tests need it). */
export function demoStyle(ex: ChatExample): DemoStyle {
  const calls = toolCalls(ex);
  return calls === 0 ? 'direct' : calls === 1 ? 'tool' : 'recover';
}

/**
 * Format-only demos as chat examples (the assistant text is what follows the generation prompt's `<reason>`).
 * 'direct' answers without the tool — with the right answer only on level-0 problems and a plausible-looking
 * guess otherwise, so SFT teaches the format but not the arithmetic; 'tool' calls the tool and copies stdout;
 * 'recover' makes a failing call first (weight 0: read, not trained, but for `trainFailedCalls` of them), then
 * fixes it.
 */
export function sftExamples(
  problems: TaskProblem[],
  mix: DemoMix,
  seed: number,
  opts: DemoOptions = {},
): ChatExample[] {
  const rng = new Rng(seed);
  const trainShare = opts.trainFailedCalls ?? 0;
  const total = mix.direct + mix.tool + mix.recover;
  if (!(total > 0)) throw new Error('sftExamples: demo mix weights must sum to > 0');
  const call = (code: string): ToolCall => ({
    type: 'function',
    function: { name: TOOL_NAME, arguments: { code, input: '' } },
  });
  const answer = (a: string, thought = '') => `${thought}</reason> <answer> \\boxed{${a}} </answer>`;
  return problems.map((p) => {
    const u = rng.next() * total;
    const style: DemoStyle = u < mix.direct ? 'direct' : u < mix.direct + mix.tool ? 'tool' : 'recover';
    const thought = opts.echo ? echoOf(p.question) : '';
    const messages: Message[] = [{ role: 'user', content: p.question }];
    if (style === 'direct') {
      messages.push({
        role: 'assistant',
        content: answer(p.level === 0 ? p.answer : guess(p.answer, rng), thought),
      });
    } else {
      if (style === 'recover') {
        const bad = breakCode(p.code, rng);
        // shown, not trained, unless asked: a policy taught the failure makes it (the variant of 2026-11-27 that
        // trained every one made four fifths of its first calls fail)
        const trained = trainShare > 0 && rng.next() < trainShare;
        messages.push({
          role: 'assistant',
          content: `${thought}</reason>`,
          tool_calls: [call(bad.code)],
          ...(trained ? {} : { weight: 0 as const }),
        });
        messages.push({ role: 'tool', content: `${bad.tool}\n\nexecution time: 0.01s` });
      }
      messages.push({
        role: 'assistant',
        content: `${style === 'recover' && opts.echo ? FIX_NOTE : ''}${thought}</reason>`,
        tool_calls: [call(p.code)],
      });
      messages.push({
        role: 'tool',
        content: `Tool call success\nstdout: ${p.answer}\n\nexecution time: 0.01s`,
      });
      messages.push({ role: 'assistant', content: answer(p.answer) });
    }
    return { messages };
  });
}

// A same-length number that is almost surely wrong: the model learns the answer format, not the answer.
function guess(answer: string, rng: Rng): string {
  const s = [...answer].map((_, i) =>
    i === 0 && answer.length > 1 ? String(rng.int(1, 9)) : String(rng.int(0, 9)),
  );
  const g = s.join('');
  return g === answer ? g.slice(0, -1) + String((Number(g.slice(-1)) + 1) % 10) : g;
}
