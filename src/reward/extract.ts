// Answer extraction, in Math-Verify's priority order with boxed first (its recommended setting for models
// told to box their answer, which the rStar2 prompt does), plus the rStar2 `<answer>` tag convention.

export type AnswerSource =
  | 'boxed'
  | 'answer-tag'
  | 'final-answer-is'
  | 'answer-colon'
  | 'math-env'
  | 'last-number'
  | 'whole';

export interface Extracted {
  answer: string;
  source: AnswerSource;
}

interface Box {
  start: number;
  end: number; // index after the closing brace
  content: string;
}

/** The content of a brace group starting at `open` (which must be `{`), or null if unbalanced. */
export function braceGroup(s: string, open: number): { content: string; end: number } | null {
  if (s[open] !== '{') return null;
  let depth = 0;
  for (let i = open; i < s.length; i++) {
    const c = s[i];
    if (c === '\\') {
      i++;
      continue;
    }
    if (c === '{') depth++;
    else if (c === '}') {
      depth--;
      if (depth === 0) return { content: s.slice(open + 1, i), end: i + 1 };
    }
  }
  return null;
}

export function findBoxes(s: string): Box[] {
  const out: Box[] = [];
  const re = /\\(?:boxed|fbox)\s*/g;
  for (let m = re.exec(s); m; m = re.exec(s)) {
    const at = m.index + m[0].length;
    if (s[at] === '{') {
      const g = braceGroup(s, at);
      if (!g) continue; // unbalanced: a truncated answer is no answer
      re.lastIndex = g.end;
      if (g.content.trim() === '') continue; // an empty box is a template, not an answer
      const nested = findBoxes(g.content); // `\boxed{\boxed{5}}`
      out.push({
        start: m.index,
        end: g.end,
        content: nested.length ? (nested.at(-1) as Box).content : g.content,
      });
    } else if (m[0].startsWith('\\boxed') && /\s/.test(m[0].slice(6, 7))) {
      // `\boxed 5`: up to the next `$` or whitespace (Qwen's rule)
      const rest = /^[^\s$]+/.exec(s.slice(at));
      if (rest) out.push({ start: m.index, end: at + rest[0].length, content: rest[0] });
    }
  }
  return out;
}

// Math-Verify's "last" boxed mode: the last box, plus earlier boxes that sit right next to it (a
// multi-part answer written as `\boxed{1}, \boxed{2}`), when their contents differ.
function joinBoxes(boxes: Box[], s: string): string {
  const parts = [boxes[boxes.length - 1]];
  for (let i = boxes.length - 2; i >= 0; i--) {
    // Stricter than Math-Verify (<70 chars containing a separator): only separators may sit between
    // joined boxes, so "\boxed{3}. After checking, it is \boxed{7}" stays 7.
    const gap = s.slice(boxes[i].end, parts[0].start);
    const rest = gap.replace(/\\text\{\s*(?:and|or)\s*\}|\\quad|\b(?:and|or)\b|[\s$,;]/gi, '');
    if (rest !== '') break;
    if (parts.some((p) => p.content.trim() === boxes[i].content.trim())) break;
    parts.unshift(boxes[i]);
  }
  return parts.map((p) => p.content.trim()).join(', ');
}

const NUMBER_RE =
  /(?<![\w.])[-−]?(?:[$€£¥₹]\s?)?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?:\s*(?:%|\\%|percent))?/g;

// A decimal comma (`2,74`, `1000,99`, `0,111`): a comma that cannot be a thousands separator.
const DECIMAL_COMMA_RE =
  /(?<![\w.,])[-−]?(?:[$€£¥₹]\s?)?(?:0,\d+|\d+,\d{1,2}|\d{4,},\d+|\d+,\d{4,})(?![\d,])/g;

function lastNumber(s: string): string | null {
  // The match that ends last wins; on a tie the longer one (`1000,99` over its tail `99`).
  let last: { at: number; end: number; text: string } | null = null;
  const consider = (at: number, text: string) => {
    const end = at + text.length;
    if (!last || end > last.end || (end === last.end && at < last.at)) last = { at, end, text };
  };
  for (const m of s.matchAll(NUMBER_RE)) consider(m.index, m[0]);
  for (const m of s.matchAll(DECIMAL_COMMA_RE)) consider(m.index, m[0].replace(',', '.'));
  return (last as { text: string } | null)?.text.replace(/[$€£¥₹]\s?/, '') ?? null;
}

// Math environments, rightmost wins; `$$…$$` and `\[…\]` may span lines, inline ones may not.
const ENV_RES = [
  /\$\$([\s\S]+?)\$\$/g,
  /\\\[([\s\S]+?)\\\]/g,
  /\\\(([^\n]+?)\\\)/g,
  /(?<!\$)\$([^$\n]+?)\$(?!\$)/g,
];

function lastMathEnv(text: string): string | null {
  // An escaped dollar (`\$5`) is money, not a delimiter: hide it while matching.
  const s = text.replace(/\\\$/g, '\u0000');
  let best: { at: number; content: string } | null = null;
  for (const re of ENV_RES) {
    for (const m of s.matchAll(re)) {
      if (!best || m.index > best.at) best = { at: m.index, content: m[1] };
    }
  }
  return best ? best.content.replace(/\u0000/g, '\\$').trim() : null;
}

function cleanTail(s: string): string {
  return s
    .trim()
    .replace(/^[:\s]+/, '')
    .replace(/[\s.。]+$/, '')
    .trim();
}

// Text after a phrase like "final answer is" or "Answer:": the math environment right there, else the
// rest of the sentence.
function afterPhrase(s: string, re: RegExp): string | null {
  let last: RegExpExecArray | null = null;
  for (const m of s.matchAll(re)) last = m as RegExpExecArray;
  if (!last) return null;
  const rest = s.slice(last.index + last[0].length).replace(/^[\s:]+/, '');
  const env = /^(?:\$\$([\s\S]+?)\$\$|\$([^$]+?)\$|\\\[([\s\S]+?)\\\]|\\\(([\s\S]+?)\\\))/.exec(rest);
  if (env) return (env[1] ?? env[2] ?? env[3] ?? env[4]).trim();
  const line = rest.split('\n')[0];
  const sentence = line.replace(/\.(\s|$)[\s\S]*$/, '');
  const out = cleanTail(sentence);
  return out === '' ? null : out;
}

function extractPlain(s: string, whole: boolean): Extracted | null {
  const minerva = /final answer is\s*\$([^$]+)\$\.?\s*I hope/i.exec(s);
  if (minerva) return { answer: minerva[1].trim(), source: 'final-answer-is' };
  const boxes = findBoxes(s);
  if (boxes.length > 0) return { answer: joinBoxes(boxes, s), source: 'boxed' };
  const fa = afterPhrase(s, /final answer(?: is|:)/gi);
  if (fa) return { answer: fa, source: 'final-answer-is' };
  const ac = afterPhrase(s, /\banswer(?: is|:)/gi);
  if (ac) return { answer: ac, source: 'answer-colon' };
  const env = lastMathEnv(s);
  if (env) return { answer: env, source: 'math-env' };
  if (whole && s.trim().length <= 200 && !/\n/.test(s.trim()))
    return { answer: cleanTail(s), source: 'whole' };
  const num = lastNumber(s);
  if (num) return { answer: num.trim(), source: 'last-number' };
  return null;
}

/**
 * Finds the answer in a model response. Order: last `\boxed{}`/`\fbox{}` anywhere (rStar2's reward
 * reads the whole response), then the last `<answer>…</answer>` block, then "final answer is",
 * "answer:", the last math environment, the last number.
 */
export function extractAnswer(text: string): Extracted | null {
  const minerva = /final answer is\s*\$([^$]+)\$\.?\s*I hope/i.exec(text);
  if (minerva) return { answer: minerva[1].trim(), source: 'final-answer-is' };
  const boxes = findBoxes(text);
  if (boxes.length > 0) return { answer: joinBoxes(boxes, text), source: 'boxed' };
  const tags = [...text.matchAll(/<answer>([\s\S]*?)(?:<\/answer>|$)/g)];
  if (tags.length > 0) {
    const inner = tags[tags.length - 1][1];
    const got = extractPlain(inner, true);
    if (got) return { answer: got.answer, source: 'answer-tag' };
  }
  return extractPlain(text, false);
}

/** Gold answers are bare strings; a boxed or `$…$` gold is unwrapped, otherwise taken whole. */
export function extractGold(gold: string): string {
  const boxes = findBoxes(gold);
  if (boxes.length > 0) return joinBoxes(boxes, gold);
  const m = /^\s*(?:\$\$?|\\\[|\\\()([\s\S]*?)(?:\$\$?|\\\]|\\\))\s*$/.exec(gold);
  return (m ? m[1] : gold).trim();
}
