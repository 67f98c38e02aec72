// Answer extraction, in Math-Verify's priority order with boxed first (its recommended setting for models
// told to box their answer, which the rStar2 prompt does), plus the rStar2 `<answer>` tag convention.

export type AnswerSource =
  | 'boxed'
  | 'answer-tag'
  | 'final-answer-is'
  | 'answer-colon'
  | 'math-env'
  | 'last-number'
  | 'whole'
  | 'prime';

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

// ---- the reference profile: Math-Verify's extraction ------------------------------------------------

export type Target = 'latex' | 'expr';

interface Span {
  start: number;
  end: number;
  text: string;
  source: AnswerSource;
  joined?: number; // math environments joined into this one (Math-Verify joins up to 6)
}

// Math-Verify's "last" box mode: walking left from the last box, an earlier box joins when fewer than 10
// characters sit between them, or fewer than 70 that contain a separator and the contents differ.
function joinBoxesMathVerify(boxes: Box[], s: string): string {
  const parts = [boxes[boxes.length - 1].content.trim()];
  for (let i = boxes.length - 2; i >= 0; i--) {
    const gap = s.slice(boxes[i].end, boxes[i + 1].start);
    const content = boxes[i].content.trim();
    const near =
      gap.length < 10 || (gap.length < 70 && /\b(?:and|or)\b|[,;]/.test(gap) && content !== parts[0]);
    if (!near) break;
    if (content !== parts[0]) parts.unshift(content);
  }
  return parts.join(', ');
}

// Math environments with Math-Verify's delimiters: `$$…$$` and `\[…\]` may span lines, `$…$` and `\(…\)`
// may not, ` […] ` needs spaces around it; a bare `\frac{n}{m}` of plain numbers counts too.
const MV_ENVS = [
  /(?<!\\)\$\$((?:[^$]|\$(?!\$))+?)(?<!\\)\$\$/g,
  /(?<!\\)\\\[([\s\S]+?)(?<!\\)\\\]/g,
  /(?<![\\\d$])\$((?:\\\$|[^\n$])+?)(?<!\\)\$/g,
  /(?<!\\)\\\(((?:[^\\\n]|\\(?!\)))+?)(?<!\\)\\\)/g,
  /(?<=\s)\[([^\n\][]+?)\](?=\s)/g,
  /(-?\\frac\{-?\d+(?:[.,]\d+)?\}\{-?\d+(?:[.,]\d+)?\})/g,
];
const PERCENT_TAIL = /^\s*(?:\\?%|[Pp]ercent(?:age)?|[Pp]ct)/;

function latexSpans(s: string): Span[] {
  const out: Span[] = [];
  for (const re of MV_ENVS) {
    for (const m of s.matchAll(re)) {
      let end = m.index + m[0].length;
      let text = m[1].trim();
      const pct = PERCENT_TAIL.exec(s.slice(end));
      if (pct) {
        end += pct[0].length;
        text = `${text}\\%`;
      }
      out.push({ start: m.index, end, text, source: 'math-env' });
    }
  }
  // Environments joined by "and"/"or"/"," form one answer (a set), as "$1$, $2$ and $3$".
  out.sort((a, b) => a.start - b.start);
  const merged: Span[] = [];
  for (const sp of out) {
    const prev = merged.at(-1);
    const joinable = prev && sp.start >= prev.end && (prev.joined ?? 1) < 6;
    if (joinable && /^\s*(?:,?\s*(?:and|or)|,)\s*$/.test(s.slice(prev.end, sp.start))) {
      merged[merged.length - 1] = {
        ...prev,
        end: sp.end,
        text: `${prev.text}, ${sp.text}`,
        joined: (prev.joined ?? 1) + 1,
      };
    } else if (!prev || sp.start >= prev.end) merged.push(sp);
  }
  return merged;
}

// Plain numbers (thousands groups with comma or space, decimal point or comma, percent words, a currency
// sign in front) and digit-led arithmetic (`2/3`, `(1/2) / (3/4)`), each after a space, `=` or the start.
const MV_NUMBER =
  /(?<=^|[\s=])(?:\*\*)?[$€£¥₹]?(-?[1-9]\d{0,2}(?:[ ,]\d{3})+(?:\.\d+)?|-?\d+[.,]\d+|\.\d+|-?\d+)(\s*(?:%|[Pp]ercent|\s*[Pp]ercentage|\s*[Pp]ct))?/g;
// (Runs are bounded, unlike Math-Verify's, so a printed table of numbers cannot make matching quadratic.)
const MV_EXPR =
  /(?<=^|[\s=])(-?\(?-?\d[\d.\s+\-*×/^()÷]{0,80}[+\-*×/^()÷][\d.\s+\-*×/^()÷]{1,80}\)?)(?=[.,:\s)$]|$)/g;

function numberText(int: string, pct: string | undefined): string {
  // `1 000` / `1,000` are thousands, `2,74` / `0,111` decimal commas (a group of three only after 1-999).
  const t = /^-?[1-9]\d{0,2}(?:[ ,]\d{3})+/.test(int) ? int.replace(/[ ,]/g, '') : int.replace(',', '.');
  return pct ? `${t}%` : t;
}

function exprSpans(s: string): Span[] {
  const out: Span[] = [];
  for (const m of s.matchAll(MV_NUMBER)) {
    const text = numberText(m[1], m[2]);
    out.push({ start: m.index, end: m.index + m[0].length, text, source: 'last-number' });
  }
  for (const m of s.matchAll(MV_EXPR)) {
    const text = m[1].replace(/[\s.]+$/, '').trim();
    out.push({ start: m.index, end: m.index + m[1].trimEnd().length, text, source: 'last-number' });
  }
  return out;
}

// Rightmost first (by end, then the longer), as Math-Verify orders matches within one priority.
function rightmost(spans: Span[]): Span | null {
  let best: Span | null = null;
  for (const sp of spans) {
    if (!best || sp.end > best.end || (sp.end === best.end && sp.start < best.start)) best = sp;
  }
  return best;
}

function allSpans(s: string, targets: Target[]): Span[] {
  const found = [
    ...(targets.includes('latex') ? latexSpans(s) : []),
    ...(targets.includes('expr') ? exprSpans(s) : []),
  ];
  return found.sort((a, b) => a.start - b.start || b.end - a.end);
}

// An anchor phrase followed (within `reach` characters) by an answer; the rightmost such answer.
function anchored(s: string, spans: Span[], anchor: RegExp, reach: number, after?: RegExp): Span | null {
  let best: Span | null = null;
  let i = 0;
  for (const m of s.matchAll(anchor)) {
    const at = m.index + m[0].length;
    while (i < spans.length && spans[i].start < at) i++;
    const sp = spans[i];
    if (!sp || sp.start > at + reach || (after && !after.test(s.slice(sp.end)))) continue;
    if (!best || sp.end > best.end) best = sp;
  }
  return best;
}

/**
 * Math-Verify's extraction (the reference reward's `parse` of the response): by priority, "final answer
 * is X. I hope" or the last `\boxed{}` group, then "final answer … is X", "answer: X", "answer … X", and
 * last the rightmost math environment or (with the `expr` target) plain number or arithmetic.
 */
export function extractReference(text: string, targets: Target[] = ['latex', 'expr']): Extracted | null {
  // Spans are the costly part and a boxed answer rarely needs them: computed on first use.
  let memo: Span[] | null = null;
  const spans = () => {
    memo ??= allSpans(text, targets);
    return memo;
  };
  const hope = /final answer is/i.test(text)
    ? anchored(text, spans(), /final answer is:?\s*/gi, 0, /^\.?\s?I hope/)
    : null;
  const boxes = targets.includes('latex') ? findBoxes(text) : [];
  const lastBox = boxes.at(-1);
  if (lastBox && (!hope || lastBox.end >= hope.end)) {
    // A box inside a math environment takes every box of that environment (Math-Verify's "all" mode).
    const env =
      boxes.length > 1 && /\$|\\[([]/.test(text)
        ? spans().find((sp) => sp.source === 'math-env' && sp.start <= lastBox.start && lastBox.end <= sp.end)
        : undefined;
    const inEnv = env ? boxes.filter((b) => b.start >= env.start && b.end <= env.end) : [];
    const answer =
      inEnv.length > 1 ? inEnv.map((b) => b.content.trim()).join(', ') : joinBoxesMathVerify(boxes, text);
    return { answer, source: 'boxed' };
  }
  if (hope) return { answer: hope.text, source: 'final-answer-is' };
  const fa = anchored(text, spans(), /final answer[\s\S]{0,100}?\s+is:?\s*/gi, 0);
  if (fa) return { answer: fa.text, source: 'final-answer-is' };
  const ac = anchored(text, spans(), /answer:/gi, 50) ?? anchored(text, spans(), /answer/gi, 50);
  if (ac) return { answer: ac.text, source: 'answer-colon' };
  const last = rightmost(spans());
  return last && { answer: last.text, source: last.source };
}

/**
 * The reference profile's gold: a bare answer is taken whole (the reference wraps it in `\boxed{}`); a gold
 * that is itself a response (boxes, math delimiters, "final answer") or read with numbers only is
 * extracted like a response.
 */
export function extractReferenceGold(gold: string, targets: Target[] = ['latex', 'expr']): string {
  const response = /\\boxed|\\fbox|\$|\\\(|\\\[|final answer/i.test(gold);
  if (response || !targets.includes('latex')) return extractReference(gold, targets)?.answer ?? gold.trim();
  return gold.trim();
}

// ---- the reference profile: PRIME's extraction ------------------------------------------------------

/**
 * PRIME's `match_answer` (PRIME-RL/PRIME@18ad596f training/verl/utils/reward_score/evaluation_utils/
 * math_util/__init__.py:333; microsoft/rStar@ecbfb943 fused_compute_score/prime_math has the same): the
 * text after the last "answer:"/"answer is"/"answers are", before a later "is the answer", the last
 * `\boxed{}` in what is left, cut before its last ". ", then after the last "be ", "is ", "=", ": ", "get "
 * (each in turn). Whatever is left is graded, found or not, so a bare answer is read whole.
 */
export function extractPrime(text: string): string {
  let r = text;
  // PRIME finds a marker in the lower-cased text and cuts the original at that index; lower-cased again
  // only after a cut.
  let lower = r.toLowerCase();
  const cut = (markers: string[], after: boolean) => {
    for (const m of markers) {
      const at = lower.lastIndexOf(m);
      if (at < 0) continue;
      r = (after ? r.slice(at + m.length) : r.slice(0, at)).trim();
      lower = r.toLowerCase();
    }
  };
  cut(['answer:', 'answer is', 'answers are'], true);
  cut(['is answer', 'is the answer', 'are answers', 'are the answers'], false);
  const box = lastBoxPrime(r);
  if (box) r = box;
  const dot = r.lastIndexOf('. ');
  if (dot >= 0) r = r.slice(0, dot).trim();
  if (box || dot >= 0) lower = r.toLowerCase();
  cut(['be ', 'is ', 'are ', '=', ': ', 'get ', 'be\n', 'is\n', 'are\n', ':\n', 'get\n'], true);
  return r.trim();
}

// PRIME's `_last_boxed_only_string`: from the last `\boxed` (else `\fbox`), the first brace group,
// counted without escapes; unbalanced is nothing.
function lastBoxPrime(s: string): string | null {
  let at = s.lastIndexOf('\\boxed');
  if (at < 0) at = s.lastIndexOf('\\fbox');
  if (at < 0) return null;
  const open = s.indexOf('{', at);
  if (open < 0) return null;
  let depth = 0;
  for (let i = open; i < s.length; i++) {
    if (s[i] === '{') depth++;
    else if (s[i] === '}' && --depth === 0) return s.slice(open + 1, i).trim() || null;
  }
  return null;
}
