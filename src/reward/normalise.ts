// Normalisation of an extracted answer, as small named rules applied in order. Each rule is a pure
// string → string function, so tests can pin each one and a result can say which rules fired.

export interface Rule {
  name: string;
  apply: (s: string) => string;
}

const UNIT_WORDS = [
  'degrees?',
  'cm',
  'centimeters?',
  'mm',
  'millimeters?',
  'km',
  'kilometers?',
  'meters?',
  'm',
  'inch(?:es)?',
  'in',
  'feet',
  'foot',
  'ft',
  'yards?',
  'miles?',
  'mph',
  'kph',
  'seconds?',
  'sec',
  'minutes?',
  'min',
  'hours?',
  'hrs?',
  'days?',
  'weeks?',
  'months?',
  'years?',
  'liters?',
  'litres?',
  'ml',
  'gallons?',
  'pounds?',
  'lbs?',
  'ounces?',
  'oz',
  'grams?',
  'kg',
  'kilograms?',
  'dollars?',
  'cents?',
  'units?',
  'square units?',
  'sq units?',
  'people',
  'students?',
  'ways?',
  'points?',
].join('|');

// A trailing unit word after a number, brace or space (optionally squared/cubed).
const UNIT_TAIL = new RegExp(
  `(?<=[\\d}\\s)])\\s*(?:sq(?:uare)?\\.?\\s+)?(?:${UNIT_WORDS})(?:\\^\\{?[23]\\}?)?\\s*$`,
  'i',
);

export const RULES: Rule[] = [
  {
    name: 'unicode',
    apply: (s) =>
      s
        .replace(/[−–—]/g, '-')
        .replace(/×/g, '\\times ')
        .replace(/÷/g, '\\div ')
        .replace(/·/g, '\\cdot ')
        .replace(/π/g, '\\pi ')
        .replace(/∞/g, '\\infty ')
        .replace(/√/g, '\\sqrt')
        .replace(/≤/g, '\\le ')
        .replace(/≥/g, '\\ge ')
        .replace(/≠/g, '\\ne ')
        .replace(/∪/g, '\\cup ')
        .replace(/∈/g, '\\in '),
  },
  { name: 'math-delimiters', apply: (s) => s.replace(/\\[()[\]]/g, ' ').replace(/\$/g, ' ') },
  { name: 'newlines', apply: (s) => s.replace(/[\n\t\r]+/g, ' ') },
  {
    name: 'left-right',
    apply: (s) =>
      s.replace(/\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big|bigg|Bigg|mleft|mright)(?![a-zA-Z])/g, ''),
  },
  {
    name: 'displaystyle',
    apply: (s) => s.replace(/\\(?:displaystyle|textstyle|scriptstyle)(?![a-zA-Z])/g, ''),
  },
  { name: 'thousands-braces', apply: (s) => s.replace(/\{,\}/g, ',').replace(/,\\!\s*/g, ',') },
  {
    name: 'spacing',
    apply: (s) =>
      s
        .replace(/(?<!\\)\\[!,;:]/g, '')
        .replace(/\\(?:quad|qquad)(?![a-zA-Z])/g, ' ')
        .replace(/(?<!\\)\\ /g, ' ')
        .replace(/~/g, ' '),
  },
  { name: 'dfrac', apply: (s) => s.replace(/\\[dtc]frac(?![a-zA-Z])/g, '\\frac') },
  {
    name: 'currency',
    apply: (s) => s.replace(/\\\$|[€£¥₹]/g, '').replace(/\\(?:text|mbox)\{\s*\\?\$\s*\}/g, ''),
  },
  {
    name: 'trig-degrees',
    // `\sin(90^{\circ}-x)`: degrees inside a trigonometric function are radians to us, so π/180 each.
    apply: (s) =>
      /\\(?:sin|cos|tan|sec|csc|cot)(?![a-zA-Z])/.test(s)
        ? s.replace(
            /(\d+(?:\.\d+)?)\s*\^\s*(?:\{\s*\\circ\s*\}|\\circ)|(\d+(?:\.\d+)?)\s*°/g,
            (_, a, b) => `(${a ?? b}\\pi/180)`,
          )
        : s,
  },
  {
    name: 'degrees',
    apply: (s) =>
      s
        .replace(/\^\s*\{\s*\\circ\s*\}/g, '')
        .replace(/\^\s*\\circ/g, '')
        .replace(/°|\\degree(?![a-zA-Z])/g, '')
        .replace(/\\circ\s*$/g, ''),
  },
  {
    name: 'text-units',
    // A trailing `\text{…}`/`\mbox{…}` after math is a unit (`5.4 \text{ cents}`, `15\mbox{ cm}^2`).
    apply: (s) => {
      const m = /^(.*[\d}\w)])\s*\\(?:text|mbox|mathrm)\{\s*[a-zA-Z][a-zA-Z .]*\}(?:\^\{?[23]\}?)?\s*$/.exec(
        s,
      );
      return m && /[\d]/.test(m[1]) ? m[1] : s;
    },
  },
  {
    name: 'percent',
    apply: (s) =>
      s.replace(/\\%/g, '%').replace(/\s*\\?(?:text\{\s*)?(?:percent(?:age)?|pct)\s*\}?\s*$/i, '%'),
  },
  {
    name: 'text-unwrap',
    apply: (s) =>
      s.replace(/\\(?:text|textbf|textit|textrm|mbox|mathrm|mathbf|mathit)\s*\{([^{}]*)\}/g, '$1'),
  },
  { name: 'unit-words', apply: (s) => s.replace(UNIT_TAIL, '').replace(UNIT_TAIL, '') },
  {
    name: 'trailing-words',
    // `5 apples`, `12.5 square feet`: words of 3+ letters after a plain number are a unit too.
    apply: (s) => {
      const m = /^(-?[\d.,/]+%?)\s+([A-Za-z]{3,}(?:\s+[A-Za-z]{3,})*)$/.exec(s.trim());
      if (!m || /^(?:sqrt|sin|cos|tan|sec|csc|cot|log|exp|and)\b/i.test(m[2])) return s;
      return m[1];
    },
  },
  { name: 'choice-letter', apply: (s) => s.replace(/^\s*\(([A-E])\)\s*$/, '$1') },
  {
    name: 'relations',
    apply: (s) =>
      s
        .replace(/\\(?:leq|leqslant|le)(?![a-zA-Z])/g, '<=')
        .replace(/\\(?:geq|geqslant|ge)(?![a-zA-Z])/g, '>=')
        .replace(/\\(?:neq|ne)(?![a-zA-Z])/g, '!=')
        .replace(/\\lt(?![a-zA-Z])/g, '<')
        .replace(/\\gt(?![a-zA-Z])/g, '>')
        .replace(/\\approx(?![a-zA-Z])/g, '='),
  },
  {
    name: 'infinity',
    apply: (s) => s.replace(/\b(?:infinity|inf)\b/gi, '\\infty').replace(/\\infin(?![a-zA-Z])/g, '\\infty'),
  },
  { name: 'empty-set', apply: (s) => s.replace(/\\(?:emptyset|varnothing)(?![a-zA-Z])|∅/g, '\\{\\}') },
  {
    name: 'and-or',
    apply: (s) => s.replace(/\s+(?:and|or)\s+/gi, ', ').replace(/\\text\{\s*(?:and|or)\s*\}/g, ','),
  },
  { name: 'dots', apply: (s) => s.replace(/\\(?:ldots|cdots|dots)(?![a-zA-Z])/g, ' ') },
  {
    name: 'trailing-punctuation',
    // Before the rules anchored at the end (`1\frac12.`). A lone trailing backslash too (`185\`): NeMo-Skills
    // strips `.` and `\` alike.
    apply: (s) => s.replace(/(?:[\s.,;:?]|\\)+$/, '').replace(/^[\s:]+/, ''),
  },
  {
    name: 'thousands-separators',
    // Only a whole number with well-formed groups: `(1,234)` stays a tuple.
    apply: (s) => (/^\s*-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?\s*%?\s*$/.test(s) ? s.replace(/,/g, '') : s),
  },
  {
    name: 'base-subscript',
    // `204_5` is written in base 5; compared as its digits (the reference's PRIME grader drops the base).
    apply: (s) => s.replace(/(\b\d+)_\{?(\d+)\}?/g, '$1'),
  },
  {
    name: 'mixed-number',
    // `1\frac{4}{5}` (also `1\frac45`) as a whole answer is 1 + 4/5, not 1 · 4/5.
    apply: (s) =>
      s.replace(/^(-?)(\d+)\s*\\frac(?:\{(\d+)\}|(\d))(?:\{(\d+)\}|(\d))$/, (_, sg, w, a1, a2, b1, b2) => {
        return `${sg}(${w}+${a1 ?? a2}/${b1 ?? b2})`;
      }),
  },
  { name: 'mixed-number-plain', apply: (s) => s.replace(/^(-?)(\d+)\s+(\d+)\/(\d+)$/, '$1($2+$3/$4)') },
  { name: 'whitespace', apply: (s) => s.replace(/\s+/g, ' ').trim() },
];

export interface Normalised {
  text: string;
  applied: string[];
}

// Math-Verify's (latex2sympy2_extended's) readings that the reference profile adds, applied before RULES.
export const REFERENCE_RULES: Rule[] = [
  {
    name: 'doubled-backslash',
    // `\\frac` from over-escaped JSON; a matrix keeps its `\\` row breaks unless its `\\begin` is
    // doubled too, where every backslash is (`\\\\` is then an over-escaped row break).
    apply: (s) =>
      /\\\\begin\{/.test(s)
        ? s.replace(/\\\\/g, '\\')
        : /matrix|array/.test(s)
          ? s
          : s.replace(/\\\\(?=[a-zA-Z])/g, '\\'),
  },
  { name: 'text-variants', apply: (s) => s.replace(/\\text(?:normal|bf|it|rm)(?![a-zA-Z])/g, '\\text') },
  // `\quadx_{2}` (no space) is still a quad followed by x.
  { name: 'quad', apply: (s) => s.replace(/\\q?quad/g, ' ') },
  { name: 'spaced-thousands-braces', apply: (s) => s.replace(/\s*\{\s*,\s*\}/g, ',') },
  {
    name: 'glued-and-or',
    // `(11,7)or(7,11)`: "and"/"or" outside words separate items even without spaces.
    apply: (s) =>
      s
        .replace(/,?\s*\\text\{\s*(?:and|or)\s*\}/g, ',')
        .replace(/(?<![a-zA-Z\\]),?\s*(?:and|or)(?![a-zA-Z])/g, ','),
  },
  {
    name: 'approx',
    // `x = 1/3 \approx 0.33` keeps the exact part; `x \approx 11` is an assignment (turned into `=` later).
    apply: (s) => {
      const at = s.lastIndexOf('\\approx');
      if (at < 0) return s;
      const left = s.slice(0, at);
      return /^\s*[a-zA-Z](?:_\{?\w+\}?)?\s*$/.test(left) ? s : left;
    },
  },
  // A ratio `7:32` is a quotient (latex2sympy reads `:` as division).
  { name: 'ratio', apply: (s) => s.replace(/(?<=[\w})\]])\s*:\s*(?=[\w{(\\-])/g, '/') },
  {
    name: 'semicolon-groups',
    // `p=5,q=2;p=7,q=2` is two tuples: `;` separates elements, `,` the parts of one.
    apply: (s) => {
      const groups = splitTopLevel(s, ';');
      if (groups.length < 2 || !groups.some((g) => splitTopLevel(g, ',').length > 1)) return s;
      return groups.map((g) => (splitTopLevel(g, ',').length > 1 ? `(${g.trim()})` : g.trim())).join(', ');
    },
  },
];

function splitTopLevel(s: string, sep: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let from = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if ('([{'.includes(c)) depth++;
    else if (')]}'.includes(c)) depth--;
    else if (c === sep && depth === 0) {
      out.push(s.slice(from, i));
      from = i + 1;
    }
  }
  out.push(s.slice(from));
  return out;
}

export function normalise(s: string, rules: Rule[] = RULES): Normalised {
  const applied: string[] = [];
  let cur = s;
  for (const r of rules) {
    const next = r.apply(cur);
    if (next !== cur) applied.push(r.name);
    cur = next;
  }
  return { text: cur, applied };
}

export function rule(name: string): Rule {
  const r = RULES.find((x) => x.name === name);
  if (!r) throw new Error(`unknown normalisation rule: ${name}`);
  return r;
}
