import assert from 'node:assert/strict';
import { test } from 'node:test';
import { InvalidArgumentError } from 'commander';
import { commaList, float, int, nonNegativeInt, port, positiveInt, seed } from '../../src/cli/options.js';

const refuses = (parse: (v: string) => unknown, value: string, expected: string) =>
  assert.throws(
    () => parse(value),
    (e: unknown) => e instanceof InvalidArgumentError && e.message === `Expected ${expected}.`,
    `${JSON.stringify(value)} should be refused`,
  );

// What Number() alone lets through and the parsers must not.
const NOT_NUMBERS = [
  '',
  ' ',
  'abc',
  '12abc',
  '0x10',
  '0b1',
  '0o7',
  'Infinity',
  '-Infinity',
  'NaN',
  '1e400',
  '1,000',
  '--5',
];

test('int: decimal integers (with sign, spaces, exponent) within the bounds given', () => {
  const p = int();
  assert.equal(p('42'), 42);
  assert.equal(p(' -7 '), -7);
  assert.equal(p('+3'), 3);
  assert.equal(p('1e5'), 100000);
  assert.equal(p('2.0'), 2);
  for (const v of [...NOT_NUMBERS, '1.5', '9007199254740993']) refuses(p, v, 'an integer');
  const r = int({ min: -1, max: 10 });
  assert.equal(r('-1'), -1);
  assert.equal(r('10'), 10);
  for (const v of ['-2', '11', 'x']) refuses(r, v, 'an integer from -1 to 10');
  refuses(int({ min: 200 }), '199', 'an integer >= 200');
  refuses(int({ max: 5 }), '6', 'an integer <= 5');
});

test('positiveInt / nonNegativeInt / seed / port', () => {
  assert.equal(positiveInt()('1'), 1);
  for (const v of ['0', '-1', '1.5', 'abc', '']) refuses(positiveInt(), v, 'a positive integer');
  assert.equal(positiveInt(4096)('4096'), 4096);
  refuses(positiveInt(4096), '4097', 'an integer from 1 to 4096');
  assert.equal(nonNegativeInt()('0'), 0);
  refuses(nonNegativeInt(), '-1', 'a non-negative integer');
  assert.equal(seed()('0'), 0);
  assert.equal(seed()('2147483647'), 2 ** 31 - 1);
  for (const v of ['-1', '2147483648', '1.5']) refuses(seed(), v, 'an integer from 0 to 2147483647');
  assert.equal(port()('0'), 0);
  assert.equal(port()('65535'), 65535);
  for (const v of ['-1', '65536', '80.5', 'http'])
    refuses(port(), v, 'a port from 0 to 65535 (0: any free port)');
});

test('float: finite decimals within the range, exclusive lower bound where asked', () => {
  const p = float();
  assert.equal(p('0.6'), 0.6);
  assert.equal(p('.5'), 0.5);
  assert.equal(p('1e-3'), 0.001);
  assert.equal(p('-2.5'), -2.5);
  for (const v of NOT_NUMBERS) refuses(p, v, 'a number');
  const topP = float({ min: 0, minExclusive: true, max: 1 });
  assert.equal(topP('1'), 1);
  assert.equal(topP('0.01'), 0.01);
  for (const v of ['0', '1.01', '-0.5']) refuses(topP, v, 'a number > 0 and <= 1');
  refuses(float({ min: 0 }), '-0.1', 'a number >= 0');
  refuses(float({ min: 0, minExclusive: true }), '0', 'a number > 0');
});

test('parsers say what they expect (the CLI tests walk every numeric option by it)', () => {
  assert.equal(positiveInt().expected, 'a positive integer');
  assert.equal(float({ min: 0, max: 10 }).expected, 'a number from 0 to 10');
  assert.equal(port().expected, 'a port from 0 to 65535 (0: any free port)');
});

test('commaList: comma-separated, trimmed, repeatable; empty items refused', () => {
  assert.deepEqual(commaList('a,b', undefined), ['a', 'b']);
  assert.deepEqual(commaList(' c ', ['a', 'b']), ['a', 'b', 'c']);
  assert.deepEqual(commaList('sglang+http://h:1', undefined), ['sglang+http://h:1']);
  for (const v of ['', ',', 'a,,b', 'a,']) {
    assert.throws(
      () => commaList(v, undefined),
      (e: unknown) => e instanceof InvalidArgumentError && /comma-separated list/.test(e.message),
    );
  }
});
