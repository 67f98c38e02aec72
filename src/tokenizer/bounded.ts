// A chat template is untrusted input (it comes with a model), so every render runs under a budget: a time
// limit, a bound on the text its blocks produce and on the size of any one list or string it builds. Without
// one, `{% for i in range(10**5) %}{% for j in range(10**5) %}...` fills the heap until V8 aborts the process.
//
// @huggingface/jinja has no hook for this, and `Template.render` builds its interpreter itself, so a few of
// the interpreter's methods (and the setting of its `range` global) are wrapped once here; they do extra work
// only while a budget is active, and renders are synchronous, so one module-level budget is enough.

import { Environment, Interpreter, type Template } from '@huggingface/jinja';

export interface RenderLimits {
  /** Wall-clock time for one render. */
  timeMs: number;
  /** Characters in any one string the template builds (the rendered text included). */
  stringChars: number;
  /** Characters all blocks produce, summed over nesting levels (an upper bound on the text built). */
  outputChars: number;
  /** Items in any one list, `range(n)` included. */
  items: number;
}

// Far above any real conversation (a 1M-token context is ~4M characters) and far below what harms the process.
export const RENDER_LIMITS: RenderLimits = {
  timeMs: 3000,
  stringChars: 16 * 2 ** 20,
  outputChars: 128 * 2 ** 20,
  items: 2 ** 18,
};

/** A render stopped by its budget; the message names the limit that was reached. */
export class RenderLimitError extends Error {}

interface Budget {
  limits: RenderLimits;
  deadline: number;
  steps: number;
  out: number;
}

let active: Budget | null = null;

type Value = { value: unknown };
type Method = (this: unknown, ...args: unknown[]) => Value;
const proto = Interpreter.prototype as unknown as Record<string, Method>;

// Date.now() on every block would cost more than most blocks.
function tick(b: Budget): void {
  if ((++b.steps & 255) === 0 && Date.now() > b.deadline) {
    throw new RenderLimitError(`took over ${b.limits.timeMs} ms (${b.steps} steps)`);
  }
}

function checkSize(v: unknown, b: Budget): void {
  if (typeof v === 'string' && v.length > b.limits.stringChars) {
    throw new RenderLimitError(`built a string of ${v.length} characters (limit ${b.limits.stringChars})`);
  }
  if (Array.isArray(v) && v.length > b.limits.items) {
    throw new RenderLimitError(`built a list of ${v.length} items (limit ${b.limits.items})`);
  }
}

// Every loop iteration and macro call runs a block, so blocks carry the clock and the output count.
const evaluateBlock = proto.evaluateBlock;
proto.evaluateBlock = function (statements, env) {
  const b = active;
  if (!b) return evaluateBlock.call(this, statements, env);
  tick(b);
  const r = evaluateBlock.call(this, statements, env);
  const v = r.value as string;
  b.out += v.length;
  if (b.out > b.limits.outputChars) {
    throw new RenderLimitError(`produced over ${b.limits.outputChars} characters`);
  }
  checkSize(v, b);
  return r;
};

// Only these make a string or list longer than their operands; checking every expression costs 70 % more
// per render, these cost little.
for (const name of ['evaluateBinaryExpression', 'applyFilter', 'evaluateCallExpression']) {
  const method = proto[name];
  if (typeof method !== 'function') throw new Error(`@huggingface/jinja: Interpreter.${name} is missing`);
  proto[name] = function (...args) {
    const r = method.apply(this, args);
    if (active) checkSize(r.value, active);
    return r;
  };
}

// The library's `range` builds the whole list first; this one refuses a long one before allocating it.
// The globals are set when a render starts and may not be set twice, so ours replaces the library's there.
const envProto = Environment.prototype as unknown as { set(name: string, value: unknown): unknown };
const setGlobal = envProto.set;
envProto.set = function (name, value) {
  return setGlobal.call(this, name, active && name === 'range' ? range(active.limits) : value);
};

function range(limits: RenderLimits) {
  return (start: number, stop?: number, step = 1): number[] => {
    const [a, z] = stop === undefined ? [0, start] : [start, stop];
    if (step === 0) throw new Error('range() step must not be zero');
    const n = Math.max(0, Math.ceil((z - a) / step));
    if (!(n <= limits.items))
      throw new RenderLimitError(`called range() for ${n} items (limit ${limits.items})`);
    return Array.from({ length: n }, (_, i) => a + i * step);
  };
}

/** `template.render(vars)` within `limits`; a RenderLimitError when a limit is reached. */
export function renderBounded(
  template: Template,
  vars: Record<string, unknown>,
  limits: RenderLimits = RENDER_LIMITS,
): string {
  const outer = active;
  active = { limits, deadline: Date.now() + limits.timeMs, steps: 0, out: 0 };
  try {
    return template.render(vars);
  } finally {
    active = outer;
  }
}
