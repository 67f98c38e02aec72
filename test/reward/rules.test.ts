import assert from 'node:assert/strict';
import { test } from 'node:test';
import { normalise, REFERENCE_RULES, RULES, rule } from '../../src/reward/normalise.js';

// One or more [input, output] pairs per named rule, applied to that rule alone.
const CASES: Record<string, [string, string][]> = {
  unicode: [
    ['3×4', '3\\times 4'],
    ['−5', '-5'],
    ['2π', '2\\pi '],
  ],
  'math-delimiters': [['$\\frac12$', ' \\frac12 ']],
  newlines: [['1\n+2', '1 +2']],
  'left-right': [['\\left(1,2\\right]', '(1,2]']],
  displaystyle: [['\\displaystyle\\frac12', '\\frac12']],
  'thousands-braces': [
    ['1{,}000', '1,000'],
    ['32,\\!348', '32,348'],
  ],
  spacing: [
    ['1\\,000', '1000'],
    ['a\\quad b', 'a  b'],
    ['1 \\\\ 2', '1 \\\\ 2'],
  ],
  dfrac: [['\\dfrac{1}{2}+\\tfrac34', '\\frac{1}{2}+\\frac34']],
  currency: [
    ['\\$18.90', '18.90'],
    ['€5', '5'],
  ],
  'trig-degrees': [
    ['\\sin(90^{\\circ}-x)', '\\sin((90\\pi/180)-x)'],
    ['\\cos 30°', '\\cos (30\\pi/180)'],
    ['30^\\circ', '30^\\circ'],
  ],
  degrees: [
    ['30^\\circ', '30'],
    ['30^{\\circ}', '30'],
    ['30°', '30'],
  ],
  'text-units': [
    ['5.4 \\text{ cents}', '5.4'],
    ['15\\mbox{ cm}^2', '15'],
    ['\\text{odd}', '\\text{odd}'],
  ],
  percent: [
    ['10\\%', '10%'],
    ['28 percent', '28%'],
  ],
  'text-unwrap': [
    ['\\text{Evelyn}', 'Evelyn'],
    ['\\mathrm{e}^2', 'e^2'],
  ],
  'unit-words': [
    ['12 inches', '12'],
    ['5 square units', '5'],
    ['3 hours', '3'],
    ['x+y', 'x+y'],
  ],
  'trailing-words': [
    ['5 apples', '5'],
    ['12.5 square feet', '12.5'],
    ['2 sqrt', '2 sqrt'],
    ['x apples', 'x apples'],
  ],
  'choice-letter': [['(B)', 'B']],
  relations: [
    ['x\\leq 3', 'x<= 3'],
    ['x \\ge 1', 'x >= 1'],
    ['x\\neq 2', 'x!= 2'],
  ],
  infinity: [['(1, infinity)', '(1, \\infty)']],
  'empty-set': [['\\emptyset', '\\{\\}']],
  'and-or': [['3 and 5', '3, 5']],
  dots: [['1,2,\\ldots', '1,2, ']],
  'thousands-separators': [
    ['7,425,000', '7425000'],
    ['1,234.5', '1234.5'],
    ['(1,234)', '(1,234)'],
    ['1,23', '1,23'],
  ],
  'base-subscript': [
    ['204_5', '204'],
    ['4210_{5}', '4210'],
    ['a_1', 'a_1'],
  ],
  'mixed-number': [
    ['1\\frac{4}{5}', '(1+4/5)'],
    ['137 \\frac12', '(137+1/2)'],
    ['\\frac{4}{5}', '\\frac{4}{5}'],
  ],
  'mixed-number-plain': [['7 3/4', '(7+3/4)']],
  'trailing-punctuation': [
    ['42.', '42'],
    ['185\\', '185'],
    ['5!', '5!'],
  ],
  whitespace: [['  1   + 2 ', '1 + 2']],
};

test('every named rule has test cases', () => {
  for (const r of RULES) assert.ok(CASES[r.name], `no cases for rule ${r.name}`);
  for (const name of Object.keys(CASES)) assert.doesNotThrow(() => rule(name));
});

for (const [name, cases] of Object.entries(CASES)) {
  test(`rule ${name}`, () => {
    const r = rule(name);
    for (const [inp, out] of cases) assert.equal(r.apply(inp), out, `${name}: ${JSON.stringify(inp)}`);
  });
}

test('normalise reports the rules that fired, in order', () => {
  const n = normalise('$\\dfrac{1}{2}$.');
  assert.equal(n.text, '\\frac{1}{2}');
  assert.deepEqual(n.applied, ['math-delimiters', 'dfrac', 'trailing-punctuation']);
});

test('unknown rule name is a clear error', () => {
  assert.throws(() => rule('nope'), /unknown normalisation rule: nope/);
});

// The reference profile's extra rules (Math-Verify's readings), applied before RULES.
const REFERENCE_CASES: Record<string, [string, string][]> = {
  'doubled-backslash': [
    ['\\\\frac{1}{2}', '\\frac{1}{2}'],
    ['\\begin{pmatrix}1 \\\\ x\\end{pmatrix}', '\\begin{pmatrix}1 \\\\ x\\end{pmatrix}'],
    [
      '\\\\begin{matrix} x \\\\\\\\ \\\\frac12 \\\\end{matrix}',
      '\\begin{matrix} x \\\\ \\frac12 \\end{matrix}',
    ],
  ],
  'text-variants': [['125\\textnormal{ miles}', '125\\text{ miles}']],
  quad: [['x_1=1,\\quadx_2=2', 'x_1=1, x_2=2']],
  'spaced-thousands-braces': [['14 {, }916', '14,916']],
  'glued-and-or': [
    ['(11,7)or(7,11)', '(11,7),(7,11)'],
    ['6 \\text{ and } 8', '6, 8'],
    ['\\text{order}', '\\text{order}'],
  ],
  approx: [
    ['x=1/3\\approx1.3', 'x=1/3'],
    ['x\\approx11', 'x\\approx11'],
  ],
  ratio: [
    ['S_{MBCN}:S=7:32', 'S_{MBCN}/S=7/32'],
    ['12:00', '12/00'],
  ],
  'semicolon-groups': [
    ['p=5,q=2;p=7,q=2', '(p=5,q=2), (p=7,q=2)'],
    ['-12;-11;-10', '-12;-11;-10'],
    ['(0;0;0),(4;-2;6)', '(0;0;0),(4;-2;6)'],
  ],
};

test('every reference rule has test cases', () => {
  assert.deepEqual(
    REFERENCE_RULES.map((r) => r.name),
    Object.keys(REFERENCE_CASES),
  );
});

for (const r of REFERENCE_RULES) {
  test(`reference rule ${r.name}`, () => {
    for (const [inp, out] of REFERENCE_CASES[r.name])
      assert.equal(r.apply(inp), out, `${r.name}: ${JSON.stringify(inp)}`);
  });
}
