import type { Command } from 'commander';
import { initModelDir } from './init-model.js';
import { MODEL_PRESETS, type ModelPreset } from './presets.js';

export function registerWorkerCommands(program: Command): void {
  const model = program
    .command('model')
    .description('Create and inspect Hugging Face-format policy model directories');
  model
    .command('init')
    .description(
      'Create a small from-scratch model directory (config.json, model.safetensors, tokenizer.json, generation_config.json)',
    )
    .requiredOption('--out <dir>', 'directory to create')
    .option('--config <preset>', `model size preset: ${Object.keys(MODEL_PRESETS).join(' | ')}`, 'tiny')
    .option('--seed <n>', 'weight initialisation seed', '0')
    .option('--force', 'write into a non-empty directory', false)
    .action(async (o: { out: string; config: string; seed: string; force: boolean }) => {
      const seed = Number(o.seed);
      if (!Number.isInteger(seed) || seed < 0)
        throw new Error(`--seed must be a non-negative integer, got ${o.seed}`);
      if (!(o.config in MODEL_PRESETS)) {
        throw new Error(`--config must be one of ${Object.keys(MODEL_PRESETS).join(', ')}, got ${o.config}`);
      }
      const info = await initModelDir({ preset: o.config as ModelPreset, out: o.out, seed, force: o.force });
      console.log(
        `${o.out}: ${o.config} model, ${(info.params / 1e6).toFixed(2)}M parameters, vocab ${info.config.vocab_size}`,
      );
    });
}
