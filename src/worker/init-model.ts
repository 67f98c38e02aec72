import { copyFileSync, existsSync, mkdirSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import {
  buildCharTokenizer,
  namedTokenizerDir,
  saveTokenizer,
  Tokenizer,
  tokenizerFromFiles,
} from '../tokenizer/index.js';
import { PolicyWorker } from './client.js';
import { MODEL_PRESETS, type ModelPreset } from './presets.js';
import type { ModelInfo, WorkerStartOptions } from './types.js';

export interface InitModelOptions {
  preset: ModelPreset;
  out: string;
  seed?: number;
  force?: boolean; // allow writing into a non-empty directory
  // A directory holding tokenizer.json (+ tokenizer_config.json), e.g. a real model's: the vocabulary
  // size and special ids come from it and its tokenizer files are copied. Default: a new char tokenizer.
  tokenizer?: string;
  shards?: number; // weights as this many HF safetensors shards with an index (default 1: model.safetensors)
  worker?: WorkerStartOptions;
}

// Copied from a tokenizer directory when present; tokenizer.json is required.
const TOKENIZER_FILES = [
  'tokenizer.json',
  'tokenizer_config.json',
  'special_tokens_map.json',
  'chat_template.jinja',
  'generation_config.json',
];

/**
 * Creates a from-scratch model directory in Hugging Face format: config.json, the weights (model.safetensors or
 * shards with model.safetensors.index.json), tokenizer files and generation_config.json.
 */
export async function initModelDir(opts: InitModelOptions): Promise<ModelInfo> {
  const preset = MODEL_PRESETS[opts.preset];
  if (!preset) {
    throw new Error(
      `unknown model preset ${JSON.stringify(opts.preset)} (choose: ${Object.keys(MODEL_PRESETS).join(', ')})`,
    );
  }
  if (existsSync(opts.out) && readdirSync(opts.out).length > 0 && !opts.force) {
    throw new Error(`${opts.out} exists and is not empty (pass --force to overwrite)`);
  }
  // a name (qwen3) or a tokenizer.json file stands for its directory
  if (opts.tokenizer !== undefined && !existsSync(opts.tokenizer) && /^\w+$/.test(opts.tokenizer))
    opts = { ...opts, tokenizer: namedTokenizerDir(opts.tokenizer) };
  if (opts.tokenizer?.endsWith('tokenizer.json') && existsSync(opts.tokenizer))
    opts = { ...opts, tokenizer: dirname(opts.tokenizer) };
  if (
    opts.tokenizer !== undefined &&
    !(existsSync(opts.tokenizer) && statSync(opts.tokenizer).isDirectory())
  ) {
    throw new Error(
      `tokenizer ${opts.tokenizer}: not a directory (give the directory that holds tokenizer.json)`,
    );
  }
  if (opts.shards !== undefined && !(Number.isInteger(opts.shards) && opts.shards >= 1)) {
    throw new Error(`shards must be a positive integer, got ${opts.shards}`);
  }
  const files = opts.tokenizer === undefined ? buildCharTokenizer() : undefined;
  const tok = files ? tokenizerFromFiles(files) : Tokenizer.load(opts.tokenizer as string);
  // Qwen's tokenizers have no bos_token, yet their config.json names <|endoftext|> (the pad) as bos.
  const bos = tok.bos ?? tok.pad;
  const config = {
    ...preset,
    vocab_size: tok.vocabSize,
    bos_token_id: bos,
    eos_token_id: tok.eos,
    pad_token_id: tok.pad,
  };
  mkdirSync(opts.out, { recursive: true });
  const w = await PolicyWorker.start(opts.worker ?? {});
  try {
    const info = await w.init(config, opts.seed ?? 0);
    await w.save(opts.out, { shards: opts.shards });
    const copied: string[] = [];
    if (files) saveTokenizer(files, opts.out);
    else {
      for (const name of TOKENIZER_FILES) {
        const src = join(opts.tokenizer as string, name);
        if (!existsSync(src)) continue;
        // copying a file onto itself would truncate it (--tokenizer DIR --out DIR --force)
        if (resolve(src) !== resolve(opts.out, name)) copyFileSync(src, join(opts.out, name));
        copied.push(name);
      }
    }
    if (!copied.includes('generation_config.json')) {
      const gen = {
        bos_token_id: bos,
        eos_token_id: [...new Set([tok.eos, tok.pad])],
        pad_token_id: tok.pad,
        do_sample: true,
        temperature: 1.0,
        top_p: 1.0,
      };
      writeFileSync(join(opts.out, 'generation_config.json'), `${JSON.stringify(gen, null, 2)}\n`);
    }
    return info;
  } finally {
    await w.close();
  }
}
