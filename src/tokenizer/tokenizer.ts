import { existsSync, readFileSync, statSync } from 'node:fs';
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
 * A Hugging Face tokenizer (tokenizer.json + optional tokenizer_config.json), loaded with
 * @huggingface/tokenizers. Ids in, ids out; no BOS is added unless the config asks for it (`add_bos_token`).
 */
export class Tokenizer {
  readonly config: TokenizerConfig;
  readonly vocabSize: number;
  /** Ids skipped by `decode(ids, { skipSpecial: true })`. */
  readonly specialIds: ReadonlySet<number>;
  private readonly hf: HfTokenizer;
  private readonly addSpecial: boolean;
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
      this.hf = new HfTokenizer({ ...tokenizerJson, added_tokens: added }, config);
    } catch (e) {
      throw new Error(`tokenizer ${source}: cannot build tokenizer: ${(e as Error).message}`);
    }
    this.config = config;
    this.addSpecial = config.add_bos_token === true;
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
    const extra = Array.isArray(config.additional_special_tokens) ? config.additional_special_tokens : [];
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
    // Newer transformers save the template beside the config instead of inside it.
    const jinjaPath = join(isDir ? path : join(path, '..'), 'chat_template.jinja');
    if (config.chat_template === undefined && existsSync(jinjaPath)) {
      config.chat_template = readFileSync(jinjaPath, 'utf8');
    }
    return new Tokenizer(json, config, jsonPath);
  }

  encode(text: string, opts: { addSpecialTokens?: boolean } = {}): number[] {
    if (typeof text !== 'string') throw new TypeError(`encode expects a string, got ${typeof text}`);
    if (text.length === 0) return [];
    const enc = this.hf.encode(text, { add_special_tokens: opts.addSpecialTokens ?? this.addSpecial });
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

  /** The chat template from tokenizer_config.json (the default one when several are named), if any. */
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
