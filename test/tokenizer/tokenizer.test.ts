import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import {
  buildCharTokenizer,
  ChatTemplate,
  MARKER_TOKENS,
  SPECIAL_TOKENS,
  saveTokenizer,
  Tokenizer,
  tokenizerFromFiles,
} from '../../src/tokenizer/index.js';
import { Rng } from '../../src/util/index.js';

const tmpDirs: string[] = [];
function tempDir(prefix: string): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  tmpDirs.push(d);
  return d;
}
after(() => {
  for (const d of tmpDirs) rmSync(d, { recursive: true, force: true });
});

const PIECES = [
  'a',
  'Z',
  '7',
  ' ',
  '  ',
  '\n',
  '\t',
  '\r\n',
  '(',
  ')',
  '{',
  '}',
  '\\',
  '"',
  "'s",
  'é',
  'ö',
  '日本',
  '∑',
  '😀',
  '<|im_start|>',
  '<|im_end|>',
  '<|endoftext|>',
  ...MARKER_TOKENS,
  '<tool',
  'call>',
  '<|im',
  'print(1+2)',
  '\\boxed{42}',
];

function randomText(rng: Rng): string {
  let s = '';
  const n = rng.int(0, 40);
  for (let i = 0; i < n; i++) s += rng.pick(PIECES);
  return s;
}

test('char tokenizer: every marker is one token, ids and special ids are as documented', () => {
  const tok = tokenizerFromFiles(buildCharTokenizer());
  assert.equal(tok.vocabSize, 256 + SPECIAL_TOKENS.length + MARKER_TOKENS.length);
  for (const t of [...SPECIAL_TOKENS, ...MARKER_TOKENS]) assert.deepEqual(tok.encode(t), [tok.idOf(t)]);
  assert.equal(tok.tokenOf(tok.imStart), '<|im_start|>');
  assert.equal(tok.eos, tok.imEnd);
  assert.equal(tok.pad, tok.idOf('<|endoftext|>'));
  assert.deepEqual([...tok.specialIds].sort(), SPECIAL_TOKENS.map((t) => tok.idOf(t)).sort());
  // printable ASCII, newline and tab are one token each; anything else falls back to UTF-8 bytes
  assert.equal(tok.encode('Hello, World!\n\t~').length, 16);
  assert.equal(tok.encode('é').length, 2);
  assert.equal(tok.encode('😀').length, 4);
  assert.deepEqual(tok.encode(''), []);
  assert.equal(tok.decode([]), '');
});

test('char tokenizer round-trips random text (markers, unicode, whitespace)', () => {
  const tok = tokenizerFromFiles(buildCharTokenizer());
  const rng = new Rng(7);
  for (let i = 0; i < 300; i++) {
    const s = randomText(rng);
    assert.equal(tok.decode(tok.encode(s)), s);
  }
});

test('skipSpecial drops <|im_*|> and <|endoftext|> but keeps the text markers', () => {
  const tok = tokenizerFromFiles(buildCharTokenizer());
  const ids = tok.encode(
    '<|im_start|>assistant\n<reason>x</reason> <answer>\\boxed{1}</answer><|im_end|><|endoftext|>',
  );
  assert.equal(
    tok.decode(ids, { skipSpecial: true }),
    'assistant\n<reason>x</reason> <answer>\\boxed{1}</answer>',
  );
  assert.ok(tok.decode(ids).startsWith('<|im_start|>'));
});

test('stream decoder emits whole characters and matches full decode', () => {
  const tok = tokenizerFromFiles(buildCharTokenizer());
  const ids = tok.encode('日本');
  const sd = tok.streamDecoder();
  assert.deepEqual(
    ids.map((id) => sd.push(id)),
    ['', '', '日', '', '', '本'],
  );
  const rng = new Rng(11);
  for (let i = 0; i < 50; i++) {
    const s = randomText(rng);
    const d = tok.streamDecoder({ skipSpecial: true });
    let out = '';
    for (const id of tok.encode(s)) out += d.push(id);
    out += d.flush();
    assert.equal(out, tok.decode(tok.encode(s), { skipSpecial: true }));
  }
  const cut = tok.streamDecoder();
  cut.push(ids[0]);
  assert.equal(cut.flush(), '\uFFFD', 'an incomplete character is flushed as U+FFFD, not lost');
});

test('save → load from a directory or a tokenizer.json path; the chat template comes along', () => {
  const dir = tempDir('rstar2-tok-');
  saveTokenizer(buildCharTokenizer({ template: 'rstar2' }), dir);
  for (const p of [dir, join(dir, 'tokenizer.json')]) {
    const tok = Tokenizer.load(p);
    assert.equal(tok.vocabSize, 267);
    assert.equal(
      tok.decode(tok.encode('x = <tool_call>\n{}</tool_call>')),
      'x = <tool_call>\n{}</tool_call>',
    );
    assert.equal(ChatTemplate.resolve('tokenizer', tok).source, ChatTemplate.named('rstar2').source);
  }
});

test('clear errors for missing and malformed files and bad ids', () => {
  const dir = tempDir('rstar2-tokbad-');
  assert.throws(() => Tokenizer.load(join(dir, 'nope')), /tokenizer path not found/);
  assert.throws(() => Tokenizer.load(dir), /tokenizer\.json not found/);
  writeFileSync(join(dir, 'tokenizer.json'), '{"model": ');
  assert.throws(() => Tokenizer.load(dir), /is not valid JSON/);
  writeFileSync(join(dir, 'tokenizer.json'), '[1,2]');
  assert.throws(() => Tokenizer.load(dir), /must hold a JSON object/);
  writeFileSync(join(dir, 'tokenizer.json'), '{"added_tokens": []}');
  assert.throws(() => Tokenizer.load(dir), /missing "model" section/);
  const tok = tokenizerFromFiles(buildCharTokenizer());
  assert.throws(() => tok.decode([5, 267]), /token id 267 is not in the vocabulary/);
  assert.throws(() => tok.decode([1.5]), /token id 1.5/);
  assert.throws(() => tok.idOf('<think>'), /"<think>" is not in the vocabulary/);
  assert.equal(tok.tryIdOf('<think>'), undefined);
  assert.throws(() => tok.tokenOf(-1), /not in the vocabulary/);
  const noChat = tokenizerFromFiles({ ...buildCharTokenizer(), config: {} });
  assert.throws(() => ChatTemplate.fromTokenizer(noChat), /no chat_template/);
});

test('toolTurnIds refuses a template whose tool render does not extend its system block', () => {
  const tok = tokenizerFromFiles(buildCharTokenizer());
  const odd = new ChatTemplate('{% for m in messages %}[{{ m.role }}]{% endfor %}', 'odd');
  assert.throws(
    () => odd.toolTurnIds(tok, ['x']),
    /odd: rendering tool messages does not start with the system block/,
  );
});

test('stopIds lists the end-of-turn ids once each', () => {
  const tok = tokenizerFromFiles(buildCharTokenizer());
  assert.deepEqual(tok.stopIds, [tok.idOf('<|im_end|>'), tok.idOf('<|endoftext|>')]);
});

test('a chat_template.jinja beside the tokenizer is used when the config has no template', () => {
  const dir = tempDir('rstar2-tokjinja-');
  try {
    saveTokenizer({ ...buildCharTokenizer(), config: { eos_token: '<|im_end|>' } }, dir);
    writeFileSync(join(dir, 'chat_template.jinja'), '{{ messages[0].content }}!');
    const tok = Tokenizer.load(dir);
    assert.equal(ChatTemplate.fromTokenizer(tok).render([{ role: 'user', content: 'hi' }]), 'hi!');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('config special tokens (additional_special_tokens, eos, pad) are skipped like flagged added tokens', () => {
  const files = buildCharTokenizer();
  const tok = tokenizerFromFiles({
    ...files,
    config: { ...files.config, additional_special_tokens: ['<reason>'] },
  });
  assert.ok(tok.specialIds.has(tok.idOf('<reason>')));
  assert.equal(tok.decode(tok.encode('<reason>a</reason>'), { skipSpecial: true }), 'a</reason>');
});
