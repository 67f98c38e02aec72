import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';

// The subset of tokenizer_config.json that rstar2 reads. Everything else is passed through untouched.
export interface TokenizerConfig {
  chat_template?: string | { name: string; template: string }[];
  eos_token?: string | { content: string } | null;
  pad_token?: string | { content: string } | null;
  bos_token?: string | { content: string } | null;
  add_bos_token?: boolean;
  clean_up_tokenization_spaces?: boolean;
  [key: string]: unknown;
}

export interface DecodeOptions {
  skipSpecial?: boolean;
}

interface AddedTokenJson {
  id: number;
  content: string;
  special?: boolean;
}

function tokenContent(t: TokenizerConfig['eos_token']): string | undefined {
  if (t === null || t === undefined) return undefined;
  return typeof t === 'string' ? t : t.content;
}

function readJsonFile(path: string, what: string): Record<string, unknown> {
  if (!existsSync(path)) throw new Error(`${what} not found: ${path}`);
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new Error(`cannot read ${what} ${path}: ${(e as Error).message}`);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (e) {
    throw new Error(`${what} ${path} is not valid JSON: ${(e as Error).message}`);
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw new Error(`${what} ${path} must hold a JSON object`);
  }
  return parsed as Record<string, unknown>;
}

/**
 * The chat templates saved beside tokenizer_config.json, which transformers reads before the config's own:
 * chat_template.jinja (where transformers 5 writes the template, and nowhere else) as the default, and
 * additional_chat_templates/NAME.jinja by name. Undefined when the directory has none.
 */
export function savedChatTemplates(dir: string): TokenizerConfig['chat_template'] {
  const file = join(dir, 'chat_template.jinja');
  const extra = join(dir, 'additional_chat_templates');
  const named = existsSync(extra)
    ? readdirSync(extra)
        .filter((f) => f.endsWith('.jinja'))
        .sort()
        .map((f) => ({ name: f.slice(0, -'.jinja'.length), template: readFileSync(join(extra, f), 'utf8') }))
    : [];
  const main = existsSync(file) ? readFileSync(file, 'utf8') : undefined;
  if (named.length === 0) return main;
  return main === undefined ? named : [{ name: 'default', template: main }, ...named];
}

// Qwen2's pre-tokenizer regex (transformers' Qwen2Tokenizer PRETOKENIZE_REGEX): digits are split one by one, which
// keeps arithmetic learnable.
export const QWEN2_SPLIT_PATTERN = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;

/**
 * tokenizer.json as transformers tokenizes with it. transformers 5 builds a tokenizer class that has its own
 * constructor (Qwen2Tokenizer) from tokenizer.json's vocabulary, merges, added tokens and post-processor only;
 * its normalizer, pre-tokenizer and decoder are the class's (for Qwen2Tokenizer: NFC, the Qwen2 split, byte-level),
 * whatever the file says. SGLang and vLLM tokenize through transformers, so prompts and SFT ids follow it.
 * A class that loads the file as it is (PreTrainedTokenizerFast, as rstar2's own tokenizers declare) is unchanged.
 */
export function asTransformersLoads(
  tokenizerJson: Record<string, unknown>,
  config: TokenizerConfig,
): Record<string, unknown> {
  const cls = config.tokenizer_class;
  if (cls !== 'Qwen2Tokenizer' && cls !== 'Qwen2TokenizerFast') return tokenizerJson;
  const byteLevel = {
    type: 'ByteLevel',
    add_prefix_space: config.add_prefix_space === true,
    use_regex: false,
  };
  return {
    ...tokenizerJson,
    normalizer: { type: 'NFC' },
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: QWEN2_SPLIT_PATTERN }, behavior: 'Isolated', invert: false },
        { ...byteLevel, trim_offsets: true },
      ],
    },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  };
}

/**
 * A Hugging Face tokenizer (tokenizer.json + optional tokenizer_config.json), loaded with
 * @huggingface/tokenizers. Ids in, ids out; `encode` adds what tokenizer.json's post-processor adds (a BOS for
 * Llama's, nothing for Qwen's byte-level one), as transformers 5 does whatever `add_bos_token` says.
 */
export class Tokenizer {
  readonly config: TokenizerConfig;
  readonly vocabSize: number;
  /** Ids skipped by `decode(ids, { skipSpecial: true })`. */
  readonly specialIds: ReadonlySet<number>;
  private readonly hf: HfTokenizer;
  private readonly cleanUp: boolean;
  private readonly idToToken: string[];

  constructor(
    tokenizerJson: Record<string, unknown>,
    config: TokenizerConfig = {},
    /** Where it was loaded from (its tokenizer.json), for messages. */
    readonly source = '<memory>',
  ) {
    const model = tokenizerJson.model as Record<string, unknown> | undefined;
    if (!model || typeof model !== 'object' || !('vocab' in model)) {
      throw new Error(`tokenizer ${source}: missing "model" section (not a Hugging Face tokenizer.json?)`);
    }
    const added = (tokenizerJson.added_tokens ?? []) as AddedTokenJson[];
    if (!Array.isArray(added)) throw new Error(`tokenizer ${source}: "added_tokens" must be an array`);
    try {
      this.hf = new HfTokenizer(
        { ...asTransformersLoads(tokenizerJson, config), added_tokens: added },
        config,
      );
    } catch (e) {
      throw new Error(`tokenizer ${source}: cannot build tokenizer: ${(e as Error).message}`);
    }
    this.config = config;
    // HF's Python default cleans up " ." -> "." on decode, which breaks exact round trips; rstar2 only cleans
    // when the config explicitly asks for it.
    this.cleanUp = config.clean_up_tokenization_spaces === true;
    const vocab = this.hf.get_vocab(true);
    this.idToToken = [];
    for (const [tok, id] of vocab) this.idToToken[id] = tok;
    this.vocabSize = this.idToToken.length;
    if (this.vocabSize === 0) throw new Error(`tokenizer ${source}: empty vocabulary`);
    // As transformers does: added tokens flagged special, plus the config's named and additional special tokens.
    const special = new Set(added.filter((t) => t.special).map((t) => t.id));
    const named = [
      config.bos_token,
      config.eos_token,
      config.pad_token,
      config.unk_token as TokenizerConfig['eos_token'],
    ];
    // transformers 5 saves them as extra_special_tokens (a list, or named ones in an object)
    const listed = config.extra_special_tokens ?? config.additional_special_tokens;
    const extra = Array.isArray(listed)
      ? listed
      : listed && typeof listed === 'object'
        ? Object.values(listed)
        : [];
    for (const t of [...named, ...extra]) {
      const name = tokenContent(t as TokenizerConfig['eos_token']);
      const id = name === undefined ? undefined : this.hf.token_to_id(name);
      if (id !== undefined) special.add(id);
    }
    this.specialIds = special;
  }

  /** Load from a model directory (tokenizer.json [+ tokenizer_config.json]) or a tokenizer.json path. */
  static load(path: string): Tokenizer {
    if (!existsSync(path)) throw new Error(`tokenizer path not found: ${path}`);
    const isDir = statSync(path).isDirectory();
    const jsonPath = isDir ? join(path, 'tokenizer.json') : path;
    const configPath = join(isDir ? path : join(path, '..'), 'tokenizer_config.json');
    const json = readJsonFile(jsonPath, 'tokenizer.json');
    const config = existsSync(configPath)
      ? (readJsonFile(configPath, 'tokenizer_config.json') as TokenizerConfig)
      : {};
    const saved = savedChatTemplates(isDir ? path : join(path, '..'));
    if (saved !== undefined) config.chat_template = saved;
    return new Tokenizer(json, config, jsonPath);
  }

  encode(text: string, opts: { addSpecialTokens?: boolean } = {}): number[] {
    if (typeof text !== 'string') throw new TypeError(`encode expects a string, got ${typeof text}`);
    if (text.length === 0) return [];
    const enc = this.hf.encode(text, { add_special_tokens: opts.addSpecialTokens ?? true });
    for (let i = 0; i < enc.ids.length; i++) {
      if (enc.ids[i] === undefined)
        throw new Error(`encode: no id for piece ${JSON.stringify(enc.tokens[i])}`);
    }
    return enc.ids;
  }

  decode(ids: readonly number[], opts: DecodeOptions = {}): string {
    if (ids.length === 0) return '';
    for (const id of ids) {
      if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize || this.idToToken[id] === undefined) {
        throw new RangeError(`decode: token id ${id} is not in the vocabulary (size ${this.vocabSize})`);
      }
    }
    let list = ids as number[];
    if (opts.skipSpecial) {
      list = ids.filter((id) => !this.specialIds.has(id));
      if (list.length === 0) return '';
    }
    return this.hf.decode(list, { skip_special_tokens: false, clean_up_tokenization_spaces: this.cleanUp });
  }

  /** Id of a vocabulary entry (e.g. '<|im_end|>'); throws if absent. */
  idOf(token: string): number {
    const id = this.tryIdOf(token);
    if (id === undefined) throw new Error(`token ${JSON.stringify(token)} is not in the vocabulary`);
    return id;
  }

  tryIdOf(token: string): number | undefined {
    return this.hf.token_to_id(token);
  }

  tokenOf(id: number): string {
    const t = this.idToToken[id];
    if (t === undefined)
      throw new RangeError(`token id ${id} is not in the vocabulary (size ${this.vocabSize})`);
    return t;
  }

  get imStart(): number {
    return this.idOf('<|im_start|>');
  }

  get imEnd(): number {
    return this.idOf('<|im_end|>');
  }

  /** End of sequence: the config's eos_token, else <|im_end|>, else <|endoftext|>. */
  get eos(): number {
    const name = tokenContent(this.config.eos_token);
    if (name !== undefined) return this.idOf(name);
    const id = this.tryIdOf('<|im_end|>') ?? this.tryIdOf('<|endoftext|>');
    if (id === undefined)
      throw new Error('tokenizer has no eos token (no eos_token in config, no <|im_end|>)');
    return id;
  }

  /** The config's bos_token, if it names one (Qwen's is null: nothing is prepended). */
  get bos(): number | undefined {
    const name = tokenContent(this.config.bos_token);
    return name === undefined ? undefined : this.idOf(name);
  }

  /** Padding: the config's pad_token, else <|endoftext|>, else eos. */
  get pad(): number {
    const name = tokenContent(this.config.pad_token);
    if (name !== undefined) return this.idOf(name);
    return this.tryIdOf('<|endoftext|>') ?? this.eos;
  }

  /** `bos_token` / `eos_token` strings for chat templates (HF passes the tokenizer's special tokens). */
  templateVars(): { bos_token: string; eos_token: string } {
    return {
      bos_token: tokenContent(this.config.bos_token) ?? '',
      eos_token: tokenContent(this.config.eos_token) ?? '<|im_end|>',
    };
  }

  /** Ids that end a generated turn: <|im_end|>, eos and <|endoftext|>, those present, deduplicated. */
  get stopIds(): number[] {
    const ids = [this.tryIdOf('<|im_end|>'), this.eos, this.tryIdOf('<|endoftext|>')];
    return [...new Set(ids.filter((x): x is number => x !== undefined))];
  }

  /** The chat template from chat_template.jinja or tokenizer_config.json (the default one when several are named). */
  get chatTemplate(): string | undefined {
    const t = this.config.chat_template;
    if (t === undefined || typeof t === 'string') return t;
    return (t.find((x) => x.name === 'default') ?? t[0])?.template;
  }

  /** A stateful decoder that turns ids into text pieces as they arrive, never splitting a UTF-8 character. */
  streamDecoder(opts: DecodeOptions = {}): StreamDecoder {
    return new StreamDecoder(this, opts);
  }
}

/**
 * Incremental decoding in O(window) per token: decode a short window that ends at the new token and emit only the
 * text beyond what the window's older part already produced. Text is held back while it ends in an incomplete
 * UTF-8 sequence (U+FFFD), so multi-byte characters split over tokens come out whole.
 */
export class StreamDecoder {
  private ids: number[] = [];
  private prefixOffset = 0;
  private readOffset = 0;

  constructor(
    private readonly tok: Tokenizer,
    private readonly opts: DecodeOptions = {},
  ) {}

  push(id: number): string {
    this.ids.push(id);
    const prefix = this.tok.decode(this.ids.slice(this.prefixOffset, this.readOffset), this.opts);
    const full = this.tok.decode(this.ids.slice(this.prefixOffset), this.opts);
    if (full.length > prefix.length && !full.endsWith('\uFFFD')) {
      this.prefixOffset = this.readOffset;
      this.readOffset = this.ids.length;
      // Drop the consumed ids so memory stays bounded on long generations.
      this.ids = this.ids.slice(this.prefixOffset);
      this.readOffset -= this.prefixOffset;
      this.prefixOffset = 0;
      return full.slice(prefix.length);
    }
    return '';
  }

  /** Text still held back (an incomplete character at the end), decoded as-is. */
  flush(): string {
    const prefix = this.tok.decode(this.ids.slice(this.prefixOffset, this.readOffset), this.opts);
    const full = this.tok.decode(this.ids.slice(this.prefixOffset), this.opts);
    this.ids = [];
    this.prefixOffset = 0;
    this.readOffset = 0;
    return full.slice(prefix.length);
  }
}
