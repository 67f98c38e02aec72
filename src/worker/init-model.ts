import { existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { buildCharTokenizer, saveTokenizer, tokenizerFromFiles } from '../tokenizer/index.js';
import { PolicyWorker } from './client.js';
import { MODEL_PRESETS, type ModelPreset } from './presets.js';
import type { ModelInfo, WorkerStartOptions } from './types.js';

export interface InitModelOptions {
  preset: ModelPreset;
  out: string;
  seed?: number;
  force?: boolean; // allow writing into a non-empty directory
  worker?: WorkerStartOptions;
}

/** Creates a from-scratch model directory: config.json, model.safetensors, tokenizer files, generation_config.json. */
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
  const files = buildCharTokenizer();
  const tok = tokenizerFromFiles(files);
  const eos = [tok.imEnd, tok.pad].filter((x, i, a) => a.indexOf(x) === i);
  const config = {
    ...preset,
    vocab_size: tok.vocabSize,
    bos_token_id: tok.pad,
    eos_token_id: tok.imEnd,
  };
  mkdirSync(opts.out, { recursive: true });
  const w = await PolicyWorker.start(opts.worker ?? {});
  try {
    const info = await w.init(config, opts.seed ?? 0);
    await w.save(opts.out);
    saveTokenizer(files, opts.out);
    const gen = {
      bos_token_id: tok.pad,
      eos_token_id: eos,
      pad_token_id: tok.pad,
      do_sample: true,
      temperature: 1.0,
      top_p: 1.0,
    };
    writeFileSync(join(opts.out, 'generation_config.json'), `${JSON.stringify(gen, null, 2)}\n`);
    return info;
  } finally {
    await w.close();
  }
}
