import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import { TEMPLATES, type TemplateName } from './templates.js';
import { QWEN2_SPLIT_PATTERN, Tokenizer, type TokenizerConfig } from './tokenizer.js';

// Tiny tokenizers for from-scratch models, in the same format as Qwen's (byte-level BPE, Qwen2 split regex, added
// tokens for the chat markers), so everything that loads a Qwen tokenizer.json loads these too.

/** Added tokens: the first three are `special` (skipped by skip-special decoding), the rest are plain text markers. */
export const SPECIAL_TOKENS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'] as const;
export const MARKER_TOKENS = [
  '<tool_call>',
  '</tool_call>',
  '<tool_response>',
  '</tool_response>',
  '<reason>',
  '</reason>',
  '<answer>',
  '</answer>',
] as const;

export { QWEN2_SPLIT_PATTERN };

/** GPT-2 byte-to-unicode table: every byte gets a printable character, printable ASCII maps to itself. */
export function byteToUnicode(): string[] {
  const out: string[] = new Array(256);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    out[b] = String.fromCodePoint(printable ? b : 256 + n++);
  }
  return out;
}

export interface BuildOptions {
  /** Chat template stored in tokenizer_config.json (default 'compact'). */
  template?: TemplateName | { source: string };
  /** Extra added tokens (plain text markers) after the standard ones. */
  extraTokens?: string[];
}

export interface TokenizerFiles {
  tokenizerJson: Record<string, unknown>;
  config: TokenizerConfig;
}

function assemble(
  vocab: Map<string, number>,
  merges: [string, string][],
  opts: BuildOptions,
): TokenizerFiles {
  const added = [...SPECIAL_TOKENS, ...MARKER_TOKENS, ...(opts.extraTokens ?? [])];
  if (new Set(added).size !== added.length) throw new Error('duplicate added tokens');
  const addedTokens = added.map((content, i) => ({
    id: vocab.size + i,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: (SPECIAL_TOKENS as readonly string[]).includes(content),
  }));
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false };
  const tokenizerJson = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: addedTokens,
    normalizer: null,
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: QWEN2_SPLIT_PATTERN }, behavior: 'Isolated', invert: false },
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
      ignore_merges: false,
      vocab: Object.fromEntries(vocab),
      merges: merges.map(([a, b]) => `${a} ${b}`),
    },
  };
  const tpl = opts.template ?? 'compact';
  const config: TokenizerConfig = {
    // loaded by transformers from tokenizer.json as it is (Qwen2Tokenizer would add NFC: see asTransformersLoads)
    tokenizer_class: 'PreTrainedTokenizerFast',
    add_bos_token: false,
    add_prefix_space: false,
    bos_token: null,
    eos_token: '<|im_end|>',
    pad_token: '<|endoftext|>',
    unk_token: null,
    clean_up_tokenization_spaces: false,
    errors: 'replace',
    split_special_tokens: false,
    model_max_length: 32768,
    additional_special_tokens: ['<|im_start|>', '<|im_end|>'],
    added_tokens_decoder: Object.fromEntries(addedTokens.map(({ id, ...rest }) => [String(id), rest])),
    chat_template: typeof tpl === 'string' ? TEMPLATES[tpl] : tpl.source,
  };
  return { tokenizerJson, config };
}

/**
 * Byte-level tokenizer with no merges: one token per byte (printable ASCII, newline and tab are one character
 * each; anything else falls back to its UTF-8 bytes), plus the chat markers as single tokens. 267 ids.
 */
export function buildCharTokenizer(opts: BuildOptions = {}): TokenizerFiles {
  const vocab = new Map<string, number>();
  // id = byte value, so ids are easy to read in dumps.
  for (const ch of byteToUnicode()) vocab.set(ch, vocab.size);
  return assemble(vocab, [], opts);
}

/** Pre-tokenize a corpus exactly as the tokenizer will (added tokens removed, Qwen2 split, byte-level map). */
function preTokenize(corpus: Iterable<string>): Map<string, number> {
  const base = buildCharTokenizer();
  const hf = new HfTokenizer(base.tokenizerJson, base.config);
  const pre = hf.pre_tokenizer;
  if (!pre) throw new Error('internal: byte-level tokenizer has no pre-tokenizer');
  const markers = new RegExp(
    [...SPECIAL_TOKENS, ...MARKER_TOKENS].map((t) => t.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|'),
    'g',
  );
  const counts = new Map<string, number>();
  for (const doc of corpus) {
    for (const section of doc.split(markers)) {
      if (section.length === 0) continue;
      for (const word of pre.pre_tokenize(section)) counts.set(word, (counts.get(word) ?? 0) + 1);
    }
  }
  return counts;
}

/**
 * Train a byte-level BPE on `corpus` until the vocabulary (bytes + merges + added tokens) reaches `vocabSize`
 * or no pair occurs at least `minFrequency` times. Deterministic: ties go to the lexicographically smallest pair.
 */
export function trainBpeTokenizer(
  corpus: Iterable<string>,
  vocabSize: number,
  opts: BuildOptions & { minFrequency?: number } = {},
): TokenizerFiles {
  const nAdded = SPECIAL_TOKENS.length + MARKER_TOKENS.length + (opts.extraTokens?.length ?? 0);
  if (!Number.isInteger(vocabSize) || vocabSize < 256 + nAdded) {
    throw new Error(
      `vocabSize must be an integer >= ${256 + nAdded} (256 bytes + ${nAdded} added tokens), got ${vocabSize}`,
    );
  }
  const minFreq = opts.minFrequency ?? 2;
  const vocab = new Map<string, number>();
  for (const ch of byteToUnicode()) vocab.set(ch, vocab.size);

  const wordCounts = preTokenize(corpus);
  const words: string[][] = [];
  const freqs: number[] = [];
  for (const [w, c] of wordCounts) {
    words.push(Array.from(w));
    freqs.push(c);
  }
  // pair key -> count, and pair key -> words containing it (indices), updated incrementally per merge.
  const SEP = '\u0000';
  const pairCounts = new Map<string, number>();
  const where = new Map<string, Set<number>>();
  const addPairs = (wi: number, sign: number): void => {
    const w = words[wi];
    for (let i = 0; i + 1 < w.length; i++) {
      const k = w[i] + SEP + w[i + 1];
      pairCounts.set(k, (pairCounts.get(k) ?? 0) + sign * freqs[wi]);
      if (sign > 0) {
        let s = where.get(k);
        if (!s) where.set(k, (s = new Set()));
        s.add(wi);
      }
    }
  };
  for (let wi = 0; wi < words.length; wi++) addPairs(wi, 1);

  const merges: [string, string][] = [];
  while (vocab.size + nAdded < vocabSize) {
    let best: string | undefined;
    let bestCount = 0;
    for (const [k, c] of pairCounts) {
      if (c > bestCount || (c === bestCount && best !== undefined && k < best)) {
        best = k;
        bestCount = c;
      }
    }
    if (best === undefined || bestCount < minFreq) break;
    const [a, b] = best.split(SEP) as [string, string];
    const merged = a + b;
    merges.push([a, b]);
    if (!vocab.has(merged)) vocab.set(merged, vocab.size);
    for (const wi of where.get(best) ?? []) {
      const w = words[wi];
      addPairs(wi, -1);
      const out: string[] = [];
      for (let i = 0; i < w.length; i++) {
        if (i + 1 < w.length && w[i] === a && w[i + 1] === b) {
          out.push(merged);
          i++;
        } else out.push(w[i]);
      }
      words[wi] = out;
      addPairs(wi, 1);
    }
    where.delete(best);
    pairCounts.delete(best);
    for (const [k, c] of pairCounts) if (c <= 0) pairCounts.delete(k);
  }
  return assemble(vocab, merges, opts);
}

/** Write tokenizer.json and tokenizer_config.json into `dir` (created if missing). */
export function saveTokenizer(files: TokenizerFiles, dir: string): void {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'tokenizer.json'), `${JSON.stringify(files.tokenizerJson, null, 2)}\n`);
  writeFileSync(join(dir, 'tokenizer_config.json'), `${JSON.stringify(files.config, null, 2)}\n`);
}

/** Load built files directly, without a round trip through disk. */
export function tokenizerFromFiles(files: TokenizerFiles): Tokenizer {
  return new Tokenizer(files.tokenizerJson, files.config);
}
