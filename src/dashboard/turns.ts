import type { Trajectory } from '../rl/index.js';

// Splits a trajectory into per-turn parts for display. The record keeps the decoded response as one
// string plus events; tool observations are located by their exact text, and template wrappers
// around them (e.g. `<|im_start|>user\n<tool_response>`) are dropped from the displayed reasoning.

export interface TurnView {
  turn: number;
  reasoning: string; // generated text minus tool-call blocks and special tokens
  raw: string; // generated text as decoded
  genTokens: number; // mask = 1 ids of this turn
  finishReason?: string;
  toolCalls: { name: string; code: string; parseError?: string }[];
  toolResults: { text: string; error: boolean; status?: string; ms: number; tokens: number }[];
}

export interface TrajectoryView {
  id: string;
  promptId: string;
  sample: number;
  finish: string;
  error?: string;
  correct?: boolean;
  reward?: number;
  gold?: string;
  extracted: string | null;
  answer: string | null; // the final turn's <answer> body, or its last boxed sentence
  turns: TurnView[];
  maskRuns: [number, number][]; // [mask value, run length] over responseMask
  trainedTokens: number;
  maskedTokens: number;
  numToolCalls: number;
  numToolErrors: number;
  kept?: boolean;
  advantage?: number;
  ms: number;
}

const SPECIAL = /<\|[a-z_]+\|>/g;

function codeOf(args: string): string {
  try {
    const a = JSON.parse(args) as unknown;
    if (a && typeof a === 'object') {
      const o = a as Record<string, unknown>;
      for (const key of ['code', 'source', 'python']) if (typeof o[key] === 'string') return o[key] as string;
    }
  } catch {
    // not JSON: show it raw
  }
  return args;
}

function codeFromBlock(block: string): string {
  try {
    const o = JSON.parse(block) as { arguments?: unknown };
    const args = typeof o.arguments === 'string' ? o.arguments : JSON.stringify(o.arguments ?? {});
    return codeOf(args);
  } catch {
    return block;
  }
}

function cleanReasoning(s: string): string {
  return s
    .replace(/<tool_call>[\s\S]*?(<\/tool_call>|$)/g, '')
    .replace(/<answer>[\s\S]*?(<\/answer>|$)/g, '')
    .replace(/<\/?reason>/g, '')
    .replace(SPECIAL, '')
    .trim();
}

// Where the generated part of a segment ends: after its last tool call, else at the end-of-turn token.
function generatedPart(seg: string): string {
  const close = seg.lastIndexOf('</tool_call>');
  if (close >= 0) return seg.slice(0, close + '</tool_call>'.length);
  const end = seg.indexOf('<|im_end|>');
  return end >= 0 ? seg.slice(0, end) : seg;
}

export function viewTrajectory(t: Trajectory & { kept?: boolean; advantage?: number }): TrajectoryView {
  const turnIds = [...new Set(t.events.map((e) => e.turn))].sort((a, b) => a - b);
  if (turnIds.length === 0) turnIds.push(0);
  const turns = new Map<number, TurnView>(
    turnIds.map((n) => [
      n,
      { turn: n, reasoning: '', raw: '', genTokens: 0, toolCalls: [], toolResults: [] },
    ]),
  );
  // cut the text at each tool observation, in order
  const segments: string[] = [];
  let pos = 0;
  let located = true;
  for (const e of t.events) {
    if (e.kind !== 'tool_result') continue;
    const at = e.text ? t.text.indexOf(e.text, pos) : -1;
    if (at < 0) {
      located = false;
      break;
    }
    segments.push(t.text.slice(pos, at));
    pos = at + e.text.length;
    const next = t.text.indexOf('<|im_start|>assistant', pos);
    if (next >= 0 && next - pos < 200) pos = t.text.indexOf('\n', next) + 1 || next;
  }
  segments.push(t.text.slice(pos));
  const gens = t.events.filter((e) => e.kind === 'generation');
  for (const e of t.events) {
    const v = turns.get(e.turn) as TurnView;
    if (e.kind === 'generation') {
      v.genTokens += e.end - e.start;
      v.finishReason = e.finishReason;
    } else if (e.kind === 'tool_call') {
      v.toolCalls.push({ name: e.name, code: codeOf(e.arguments), parseError: e.parseError });
    } else if (e.kind === 'tool_result') {
      v.toolResults.push({
        text: e.text,
        error: e.error,
        status: e.status,
        ms: e.ms,
        tokens: e.end - e.start,
      });
    } else if (e.kind === 'error') {
      v.toolResults.push({ text: e.message, error: true, status: 'error', ms: 0, tokens: 0 });
    }
  }
  if (located && segments.length === gens.length) {
    gens.forEach((g, i) => {
      const v = turns.get(g.turn) as TurnView;
      const raw = i < segments.length - 1 ? generatedPart(segments[i]) : segments[i];
      v.raw += raw;
      v.reasoning += cleanReasoning(raw);
      // a call event without its code (some producers record only the name): show the text's block
      const blocks = [...raw.matchAll(/<tool_call>([\s\S]*?)<\/tool_call>/g)].map((b) => b[1].trim());
      v.toolCalls.forEach((c, j) => {
        if ((c.code.trim() === '' || c.code.trim() === '{}') && blocks[j]) c.code = codeFromBlock(blocks[j]);
      });
    });
  } else {
    // events and text disagree (e.g. a different template): show the whole text under the first turn
    const v = turns.get(turnIds[0]) as TurnView;
    v.raw = t.text;
    v.reasoning = cleanReasoning(t.text);
  }
  const last = ([...turns.values()].filter((u) => u.raw !== '').at(-1) ?? turns.get(turnIds[0])) as TurnView;
  const answerTag = /<answer>([\s\S]*?)(<\/answer>|$)/.exec(last.raw);
  const maskRuns: [number, number][] = [];
  for (const m of t.responseMask) {
    const r = maskRuns.at(-1);
    if (r && r[0] === m) r[1]++;
    else maskRuns.push([m, 1]);
  }
  const trained = t.responseMask.reduce((a, m) => a + m, 0);
  return {
    id: t.id,
    promptId: t.promptId,
    sample: t.sample,
    finish: t.finish,
    error: t.error,
    correct: t.correct,
    reward: t.reward,
    gold: t.gold,
    extracted: t.verify?.extracted ?? null,
    answer: answerTag
      ? answerTag[1].replace(SPECIAL, '').trim()
      : (last.raw
          .split('\n')
          .reverse()
          .find((l) => l.includes('\\boxed'))
          ?.replace(SPECIAL, '')
          .trim() ?? null),
    turns: [...turns.values()],
    maskRuns,
    trainedTokens: trained,
    maskedTokens: t.responseMask.length - trained,
    numToolCalls: t.numToolCalls,
    numToolErrors: t.numToolErrors,
    kept: t.kept,
    advantage: t.advantage,
    ms: t.ms,
  };
}
