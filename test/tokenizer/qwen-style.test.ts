import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import {
  byteToUnicode,
  ChatTemplate,
  PYTHON_TOOL_SCHEMA,
  promptIds,
  Tokenizer,
  toolTurnIds,
} from '../../src/tokenizer/index.js';

const tmpDirs: string[] = [];
function tempDir(prefix: string): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  tmpDirs.push(d);
  return d;
}
after(() => {
  for (const d of tmpDirs) rmSync(d, { recursive: true, force: true });
});

// A small tokenizer.json in the exact shape of Qwen2.5's: NFC normalizer, Qwen2 split regex + byte-level
// pre-tokenizer, BPE with "a b" merges, added tokens at Qwen's ids (sparse vocabulary), GPT-2 byte order (so
// '\n' is 198 and ' ' is 220, as in Qwen).
const QWEN_SPLIT =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function qwenStyleDir(): string {
  const b2u = byteToUnicode();
  const order: number[] = [];
  for (let b = 0; b < 256; b++) if (b2u[b].codePointAt(0) === b) order.push(b);
  for (let b = 0; b < 256; b++) if (b2u[b].codePointAt(0) !== b) order.push(b);
  const vocab: Record<string, number> = {};
  order.forEach((b, i) => {
    vocab[b2u[b]] = i;
  });
  const merges = ['h e', 'Ġ t', 'i s', 'Ġt he', 'Ġ is', 'u s', 'e r', 'us er'];
  for (const m of merges) vocab[m.replace(' ', '')] = Object.keys(vocab).length;
  const added = (id: number, content: string, special: boolean) => ({
    id,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special,
  });
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false };
  const tokenizerJson = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [
      added(151643, '<|endoftext|>', true),
      added(151644, '<|im_start|>', true),
      added(151645, '<|im_end|>', true),
      added(151657, '<tool_call>', false),
      added(151658, '</tool_call>', false),
    ],
    normalizer: { type: 'NFC' },
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: QWEN_SPLIT }, behavior: 'Isolated', invert: false },
        byteLevel,
      ],
    },
    post_processor: byteLevel,
    decoder: byteLevel,
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: '',
      end_of_word_suffix: '',
      fuse_unk: false,
      byte_fallback: false,
      vocab,
      merges,
    },
  };
  const config = {
    add_bos_token: false,
    bos_token: null,
    eos_token: '<|im_end|>',
    pad_token: '<|endoftext|>',
    clean_up_tokenization_spaces: false,
    chat_template: ChatTemplate.named('qwen').source,
  };
  const dir = tempDir('rstar2-qwen-');
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tokenizerJson));
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify(config));
  return dir;
}

const dir = qwenStyleDir();
const HE = 256;
const G_T = 257;
const G_THE = 259;
const G_IS = 260;
const USER = 263;

test('Qwen-style tokenizer.json loads; BPE merges, digit split and byte ids match Qwen conventions', () => {
  const tok = Tokenizer.load(dir);
  assert.deepEqual(tok.encode('he is the'), [HE, G_IS, G_THE]);
  assert.deepEqual(tok.encode('\n'), [198]);
  assert.deepEqual(tok.encode(' '), [220]);
  assert.deepEqual(tok.encode('123'), [tok.idOf('1'), tok.idOf('2'), tok.idOf('3')]);
  assert.deepEqual(tok.encode(' t'), [G_T]);
  assert.equal(tok.vocabSize, 151659);
  assert.equal(tok.imStart, 151644);
  assert.equal(tok.imEnd, 151645);
  assert.equal(tok.eos, 151645);
  assert.equal(tok.pad, 151643);
  assert.equal(tok.idOf('<tool_call>'), 151657);
  assert.throws(() => tok.decode([1000]), /token id 1000 is not in the vocabulary/);
  for (const s of [
    'he is the user',
    'print(2**10)\n',
    '日本 and "quotes"\t',
    '<tool_call>\n{"a": 1}\n</tool_call>',
  ]) {
    assert.equal(tok.decode(tok.encode(s)), s);
  }
  // `<tool_call>` is an added token but not special (Qwen): skip-special decoding keeps it.
  const ids = tok.encode('<|im_start|>user\n<tool_call>x</tool_call><|im_end|>');
  assert.deepEqual(ids.slice(0, 3), [151644, USER, 198]);
  assert.equal(tok.decode(ids, { skipSpecial: true }), 'user\n<tool_call>x</tool_call>');
});

test('prompt ids with the Qwen-style tokenizer equal the encoded rendered prompt', () => {
  const tok = Tokenizer.load(dir);
  const msgs = [{ role: 'user' as const, content: 'is the' }];
  const ids = promptIds(tok, msgs, [PYTHON_TOOL_SCHEMA]);
  const text = ChatTemplate.named('rstar2').render(msgs, {
    tools: [PYTHON_TOOL_SCHEMA],
    addGenerationPrompt: true,
  });
  assert.deepEqual(ids, tok.encode(text));
  assert.equal(tok.decode(ids), text);
  assert.equal(ids[0], 151644);
  // generation prompt: <|im_start|>assistant\n<reason>, with <reason> as text in Qwen's vocabulary
  assert.ok(tok.decode(ids).endsWith('<|im_end|>\n<|im_start|>assistant\n<reason>'));
});

test('tool-turn ids: exactly the reference append, no \\n after the assistant <|im_end|>', () => {
  const tok = Tokenizer.load(dir);
  const turn = toolTurnIds(tok, ['Tool call success\nstdout: 2\n\nexecution time: 0.01s']);
  const expected = [
    151644,
    USER,
    198,
    ...tok.encode('<tool_response>\nTool call success\nstdout: 2\n\nexecution time: 0.01s\n</tool_response>'),
    151645,
    198,
    151644,
    ...tok.encode('assistant\n<reason>'),
  ];
  assert.deepEqual(turn, expected);
  assert.equal(turn[0], tok.imStart);
  const rerender = toolTurnIds(tok, ['x'], { boundary: 'rerender' });
  assert.deepEqual(rerender, [198, ...toolTurnIds(tok, ['x'])]);
  // two tool results are merged into one user turn
  const two = tok.decode(toolTurnIds(tok, ['a', 'b']));
  assert.equal(
    two,
    '<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>',
  );
  // qwen template: same user turn, plain generation prompt
  const q = toolTurnIds(tok, ['a'], { template: ChatTemplate.named('qwen') });
  assert.equal(
    tok.decode(q),
    '<|im_start|>user\n<tool_response>\na\n</tool_response><|im_end|>\n<|im_start|>assistant\n',
  );
  assert.throws(() => toolTurnIds(tok, []), /at least one tool response/);
});

test('a whole trajectory concatenated token-wise differs from a re-render only by the boundary \\n', () => {
  const tok = Tokenizer.load(dir);
  const tpl = ChatTemplate.named('rstar2');
  const q = { role: 'user' as const, content: 'Q' };
  const gen = tok.encode('he<tool_call>\n{}\n</tool_call><|im_end|>');
  const ref = [...promptIds(tok, [q]), ...gen, ...toolTurnIds(tok, ['out'])];
  const fix = [...promptIds(tok, [q]), ...gen, ...toolTurnIds(tok, ['out'], { boundary: 'rerender' })];
  const rerendered = tpl.render(
    [
      q,
      { role: 'assistant', content: '<reason>he<tool_call>\n{}\n</tool_call>' },
      { role: 'tool', content: 'out' },
    ],
    { addGenerationPrompt: true, vars: { rstar2_prefix_quirk: false } },
  );
  assert.equal(tok.decode(fix), rerendered);
  assert.notEqual(tok.decode(ref), rerendered);
  assert.equal(
    tok.decode(ref),
    rerendered.replace('</tool_call><|im_end|>\n<|im_start|>user', '</tool_call><|im_end|><|im_start|>user'),
  );
});
