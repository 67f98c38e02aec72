import { RocSchema } from './roc.js';
import type { Trajectory } from './trajectory.js';

// RoC penalties (reference roc.py). They only ever rank positive traces; negatives are never weighted.

export interface PenaltyOptions {
  /** 'substring': a tool response counts as an error when its lowercase text contains "error" (reference);
   *  'flag': use the structured `error` flag the agent loop recorded on each tool result. */
  errorMatch: 'substring' | 'flag';
  /** Error penalty of a trace with no tool response at all. */
  noToolErrorPenalty: number;
  /** 'reference': count only assistant turns that follow a tool response (the first assistant header lives in
   *  the prompt), so a correct trace with no tool call gets the worst format penalty 1.0;
   *  'paper': count every assistant turn, so one clean answer without tools gets 0. */
  formatTurns: 'reference' | 'paper';
  answerOpen: string;
  answerClose: string;
}

/** The penalty options of a stage's RoC settings (their defaults: the schema's); answers in <answer> tags. */
export function penaltyOptions(
  roc: Pick<PenaltyOptions, 'errorMatch' | 'noToolErrorPenalty' | 'formatTurns'>,
): PenaltyOptions {
  const { errorMatch, noToolErrorPenalty, formatTurns } = roc;
  return { errorMatch, noToolErrorPenalty, formatTurns, answerOpen: '<answer>', answerClose: '</answer>' };
}

export const DEFAULT_PENALTY_OPTIONS: PenaltyOptions = penaltyOptions(RocSchema.parse({}));

type PenaltyInput = Pick<Trajectory, 'text' | 'events'>;

function toolResults(t: PenaltyInput): { text: string; error: boolean }[] {
  const fromEvents = t.events.filter((e) => e.kind === 'tool_result');
  if (fromEvents.length > 0) return fromEvents.map((e) => ({ text: e.text, error: e.error }));
  // Records without events (e.g. imported text): fall back to the reference's regex over the text.
  return [...t.text.matchAll(/<tool_response>([\s\S]*?)<\/tool_response>/g)].map((m) => ({
    text: m[1],
    error: false,
  }));
}

/** Fraction of tool responses that are errors; `noToolErrorPenalty` when there are none. */
export function rocErrorRatioPenalty(
  t: PenaltyInput,
  opts: PenaltyOptions = DEFAULT_PENALTY_OPTIONS,
): number {
  const results = toolResults(t);
  if (results.length === 0) return opts.noToolErrorPenalty;
  const isErr = (r: { text: string; error: boolean }) =>
    opts.errorMatch === 'substring' ? r.text.toLowerCase().includes('error') : r.error;
  return results.filter(isErr).length / results.length;
}

function count(text: string, needle: string): number {
  if (needle === '') return 0;
  return text.split(needle).length - 1;
}

/** Answer-tag repetition penalty: min(1, (answers - 1) / turns); 1 when the answer tags are missing/unbalanced. */
export function rocAnswerFormatPenalty(
  t: PenaltyInput,
  opts: PenaltyOptions = DEFAULT_PENALTY_OPTIONS,
): number {
  const { text } = t;
  const open = count(text, opts.answerOpen);
  const close = count(text, opts.answerClose);
  if (open === 0 || close === 0) return 1;
  const closed = countClosedPairs(text, opts.answerOpen, opts.answerClose);
  if (open !== closed || close !== closed) return 1;
  const gens = t.events.filter((e) => e.kind === 'generation');
  // The reference only sees assistant turns whose header is in the response, i.e. all but the first.
  const counted = opts.formatTurns === 'paper' ? gens : gens.slice(1);
  const turns = counted.filter((e) => e.finishReason === 'stop').length;
  if (turns === 0) return 1;
  return Math.min((closed - 1) / turns, 1);
}

// Non-overlapping `open.*?close` matches, as the reference's lazy DOTALL findall counts them.
function countClosedPairs(text: string, open: string, close: string): number {
  let n = 0;
  let i = 0;
  for (;;) {
    const a = text.indexOf(open, i);
    if (a < 0) return n;
    const b = text.indexOf(close, a + open.length);
    if (b < 0) return n;
    n++;
    i = b + close.length;
  }
}

export interface RocPenaltyFlags {
  rocErrorRatio: boolean;
  rocAnswerFormat: boolean;
}

/** Total positive-ranking penalty: an unweighted sum of the enabled parts. */
export function rocPenalty(t: PenaltyInput, flags: RocPenaltyFlags, opts: PenaltyOptions): number {
  return (
    (flags.rocErrorRatio ? rocErrorRatioPenalty(t, opts) : 0) +
    (flags.rocAnswerFormat ? rocAnswerFormatPenalty(t, opts) : 0)
  );
}
