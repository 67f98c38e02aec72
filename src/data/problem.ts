import { getPath, kindOf } from './files.js';
import type { Layout } from './layouts.js';

export { isLayout, LAYOUTS, type Layout } from './layouts.js';

/** One problem, whatever file it came from: what rollouts, RL and eval read. */
export interface Problem {
  id: string;
  question: string;
  answer: string | null; // gold answer; null when the row has none (allowed only where no reward is needed)
  source?: string; // data_source / source column
  meta?: Record<string, unknown>; // the row's other fields, untouched
}

/** Dotted paths that override where a layout reads a field (`{question: 'q', answer: 'extra.gt'}`). */
export interface FieldMap {
  id?: string;
  question?: string;
  answer?: string;
  source?: string;
}
const MAP_KEYS = ['id', 'question', 'answer', 'source'] as const;

// DAPO-Math-17k (BytedTsinghua-SIA/DAPO-Math-17k) is verl-shaped, but each user message wraps the problem in
// an instruction for DAPO's "Answer: X" reward. rStar2 asks for \boxed{} through its own template, so the
// wrapper is stripped and the question is the bare problem. The strings, exactly as in the dataset:
export const DAPO_PREFIX =
  'Solve the following math problem step by step. The last line of your response should be of the form ' +
  'Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n';
export const DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".';

const PLAIN_QUESTION = ['problem', 'question', 'prompt'];
const PLAIN_ANSWER = ['answer', 'gold', 'solution'];

const LAYOUT_HELP =
  'verl (prompt: a chat list of {role, content}, reward_model.ground_truth), ' +
  'dapo (verl whose user message is wrapped in the DAPO-Math instruction), ' +
  'plain (problem | question | prompt as a string, answer | gold | solution)';

type ChatList = { role: string; content: string }[];

function isChatList(v: unknown): v is ChatList {
  return (
    Array.isArray(v) &&
    v.length > 0 &&
    v.every((m) => typeof m === 'object' && m !== null && typeof m.role === 'string' && 'content' in m)
  );
}

const lastUser = (chat: ChatList) => chat.findLast((m) => m.role === 'user')?.content;
const isDapoWrapped = (s: unknown) =>
  typeof s === 'string' && s.startsWith(DAPO_PREFIX) && s.endsWith(DAPO_SUFFIX);

/** The layout a row looks like, or null. */
export function detectLayout(row: Record<string, unknown>): Layout | null {
  if (isChatList(row.prompt)) return isDapoWrapped(lastUser(row.prompt)) ? 'dapo' : 'verl';
  if ([...PLAIN_QUESTION, ...PLAIN_ANSWER, 'id'].some((k) => k in row)) return 'plain';
  return null;
}

/** 'question=q,answer=extra.gt' → FieldMap (for --map). */
export function parseFieldMap(spec: string): FieldMap {
  const map: FieldMap = {};
  for (const part of spec.split(',')) {
    const [key, path, ...rest] = part.split('=').map((s) => s.trim());
    if (!(MAP_KEYS as readonly string[]).includes(key) || !path || rest.length > 0) {
      throw new Error(`bad field map '${part}': expected KEY=PATH with KEY one of ${MAP_KEYS.join(', ')}`);
    }
    map[key as keyof FieldMap] = path;
  }
  return map;
}

export interface RowOptions {
  layout?: Layout | 'auto'; // default 'auto': detected per row, so files mixing verl and DAPO rows work
  map?: FieldMap;
  /** RL and eval data: a row without a gold answer is an error instead of answer: null. */
  requireAnswer?: boolean;
}

/** One row → a Problem, or an error naming where, which field, and what was wrong. */
export function problemFromRow(
  row: Record<string, unknown>,
  where: string,
  index: number,
  opts: RowOptions = {},
): { problem: Problem; layout: Layout } {
  const map = opts.map ?? {};
  const layout =
    !opts.layout || opts.layout === 'auto'
      ? (detectLayout(row) ?? (map.question ? 'plain' : null))
      : opts.layout;
  if (layout === null) {
    const hint = Array.isArray(row.messages)
      ? 'this looks like SFT chat data (read it with loadChatExamples / data inspect --sft)'
      : 'name a layout or map the fields (--layout NAME, --map question=FIELD,answer=FIELD)';
    throw new Error(
      `${where}: unknown layout; fields seen: ${Object.keys(row).join(', ') || '(none)'}; tried ${LAYOUT_HELP}; ${hint}`,
    );
  }
  const used = new Set<string>();
  const field = (path: string) => {
    if (!path.includes('.')) used.add(path);
    return getPath(row, path);
  };

  let question: unknown;
  let qField: string;
  if (map.question) {
    qField = map.question;
    question = field(qField);
    if (question === undefined) throw new Error(`${where}: no field '${qField}' (mapped to question)`);
    if (isChatList(question)) question = lastUser(question);
  } else if (layout === 'plain') {
    qField = PLAIN_QUESTION.find((k) => k in row) ?? 'problem';
    question = field(qField);
    if (typeof question !== 'string') {
      throw new Error(`${where}: needs a non-empty string field 'problem' (or 'question' / 'prompt')`);
    }
  } else {
    qField = 'prompt';
    const chat = field('prompt');
    if (!isChatList(chat)) {
      throw new Error(`${where}: field 'prompt' must be a chat list of {role, content}, got ${kindOf(chat)}`);
    }
    question = lastUser(chat);
    if (question === undefined) throw new Error(`${where}: field 'prompt' has no user message`);
    if (typeof question !== 'string') {
      throw new Error(
        `${where}: field 'prompt': the user message's content must be a string, got ${kindOf(question)}`,
      );
    }
    if (layout === 'dapo') {
      if (!isDapoWrapped(question)) {
        throw new Error(
          `${where}: field 'prompt': the user message is not wrapped in the DAPO-Math instruction ` +
            `('${DAPO_PREFIX.slice(0, 40)}…' … '${DAPO_SUFFIX.trim()}'); use layout verl to keep it whole`,
        );
      }
      question = question.slice(DAPO_PREFIX.length, -DAPO_SUFFIX.length);
    }
  }
  if (typeof question !== 'string') {
    throw new Error(`${where}: field '${qField}' must be a string (or a chat list), got ${kindOf(question)}`);
  }
  if (question.trim() === '') throw new Error(`${where}: empty question (field '${qField}')`);

  let aField: string;
  let answer: unknown;
  if (map.answer) {
    aField = map.answer;
    answer = field(aField);
  } else if (layout === 'plain') {
    aField = PLAIN_ANSWER.find((k) => row[k] !== undefined && row[k] !== null) ?? 'answer';
    answer = field(aField);
  } else {
    aField = 'reward_model.ground_truth';
    answer = getPath(row, aField);
    used.add('reward_model');
  }
  if (typeof answer === 'number') answer = String(answer);
  if (answer !== undefined && answer !== null && typeof answer !== 'string') {
    throw new Error(`${where}: answer field '${aField}' must be a string or a number, got ${kindOf(answer)}`);
  }
  const gold = typeof answer === 'string' && answer.trim() !== '' ? answer.trim() : null;
  if (gold === null && opts.requireAnswer) {
    const named = layout === 'plain' && !map.answer ? "'answer' (or 'gold' / 'solution')" : `'${aField}'`;
    throw new Error(`${where}: missing string field ${named}: RL and eval data need a gold answer`);
  }

  let id: unknown;
  if (map.id) id = field(map.id);
  else if (layout === 'plain') id = field('id');
  else id = getPath(row, 'extra_info.index');
  if (id !== undefined && id !== null && typeof id !== 'string' && typeof id !== 'number') {
    throw new Error(`${where}: id must be a string or a number, got ${kindOf(id)}`);
  }

  const sourceField = map.source ?? ['data_source', 'source'].find((k) => typeof row[k] === 'string');
  const source = sourceField ? field(sourceField) : undefined;
  const problem: Problem = {
    id: id === undefined || id === null || id === '' ? `p${index}` : String(id),
    question,
    answer: gold,
  };
  if (typeof source === 'string') problem.source = source;
  const meta = Object.fromEntries(Object.entries(row).filter(([k]) => !used.has(k)));
  if (Object.keys(meta).length > 0) problem.meta = meta;
  return { problem, layout };
}
