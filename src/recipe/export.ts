import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { TEMPLATE_NAMES, TEMPLATES, type TemplateName } from '../tokenizer/index.js';

// `rstar2 export`: a checkpoint as a model directory to serve or publish: the weights, their config and the
// tokenizer, without the optimizer and trainer state, and with the chat template the run trained with in
// tokenizer_config.json (a checkpoint keeps the base model's, so vLLM's chat endpoint prompted it differently).

// what a served model needs; optimizer.pt, its per-rank shards and trainer_state.json stay behind
const KEEP =
  /^(config\.json|generation_config\.json|.*\.safetensors|model\.safetensors\.index\.json|tokenizer\.json|special_tokens_map\.json|vocab\.json|merges\.txt)$/;

export interface ExportResult {
  files: string[];
  template: string; // the template written, or 'model' (the directory's own, kept)
}

/** The recipe a checkpoint of RUN/checkpoints/NAME was trained with, if its run is beside it. */
function runTemplate(ckpt: string): string | undefined {
  const cfg = join(dirname(dirname(ckpt)), 'config.json');
  if (basename(dirname(ckpt)) !== 'checkpoints' || !existsSync(cfg)) return undefined;
  return (JSON.parse(readFileSync(cfg, 'utf8')) as { tokenizer?: { template?: string } }).tokenizer?.template;
}

export function exportCheckpoint(checkpoint: string, out: string, template?: string): ExportResult {
  const ckpt = resolve(checkpoint);
  if (!existsSync(join(ckpt, 'config.json')))
    throw new Error(
      `export: ${checkpoint} has no config.json (give a checkpoint: RUN/checkpoints/STAGE-step-N)`,
    );
  if (existsSync(out) && readdirSync(out).length > 0)
    throw new Error(`export: ${out} exists and is not empty`);
  const tpl = template ?? runTemplate(ckpt);
  if (tpl === undefined)
    throw new Error(
      `export: ${checkpoint} is not under a run's checkpoints/ (its config.json names the template): give --template ${TEMPLATE_NAMES.join('|')}|model`,
    );
  if (tpl !== 'model' && !(TEMPLATE_NAMES as string[]).includes(tpl))
    throw new Error(`export: unknown template '${tpl}' (known: ${TEMPLATE_NAMES.join(', ')}, model)`);
  mkdirSync(out, { recursive: true });
  const files = readdirSync(ckpt).filter((f) => KEEP.test(f));
  for (const f of files) copyFileSync(join(ckpt, f), join(out, f));
  const cfgPath = join(ckpt, 'tokenizer_config.json');
  const cfg = existsSync(cfgPath)
    ? (JSON.parse(readFileSync(cfgPath, 'utf8')) as Record<string, unknown>)
    : {};
  if (tpl === 'model') {
    if (existsSync(join(ckpt, 'chat_template.jinja')))
      copyFileSync(join(ckpt, 'chat_template.jinja'), join(out, 'chat_template.jinja'));
  } else {
    cfg.chat_template = TEMPLATES[tpl as TemplateName];
    // transformers reads chat_template.jinja before tokenizer_config.json's: one file, the trained template
    writeFileSync(join(out, 'chat_template.jinja'), TEMPLATES[tpl as TemplateName]);
  }
  writeFileSync(join(out, 'tokenizer_config.json'), `${JSON.stringify(cfg, null, 2)}\n`);
  return {
    files: [
      ...files,
      'tokenizer_config.json',
      ...(existsSync(join(out, 'chat_template.jinja')) ? ['chat_template.jinja'] : []),
    ],
    template: tpl,
  };
}
