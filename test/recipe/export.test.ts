import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { ChatTemplate, PYTHON_TOOL_SCHEMA, Tokenizer } from '../../src/tokenizer/index.js';

// `rstar2 export` (issue 44): a checkpoint without its optimizer, with the template it was trained with.

const bin = join(import.meta.dirname, '../../bin/rstar2.js');
const rstar2 = (args: string[]) => spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8' });

test('export writes weights, config and tokenizer with the training template, and leaves the optimizer behind', {
  timeout: 120_000,
}, () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-export-'));
  const base = join(dir, 'base');
  const init = rstar2(['model', 'init', '--config', 'tiny', '--out', base]);
  assert.equal(init.status, 0, init.stderr);
  // a run that trained the base model with the compact template: its checkpoint keeps the base's template
  const run = join(dir, 'run');
  const ckpt = join(run, 'checkpoints', 'rl-step-000002');
  mkdirSync(ckpt, { recursive: true });
  cpSync(base, ckpt, { recursive: true });
  const baseCfg = JSON.parse(readFileSync(join(base, 'tokenizer_config.json'), 'utf8'));
  writeFileSync(
    join(ckpt, 'tokenizer_config.json'),
    JSON.stringify({ ...baseCfg, chat_template: '{{ "base" }}' }),
  );
  writeFileSync(join(ckpt, 'optimizer.pt'), 'state');
  writeFileSync(join(ckpt, 'trainer_state.json'), '{}');
  writeFileSync(join(run, 'config.json'), JSON.stringify({ tokenizer: { template: 'compact' } }));
  const out = join(dir, 'exported');
  const r = rstar2(['export', ckpt, '--out', out]);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /chat template: compact/);
  assert.ok(!existsSync(join(out, 'optimizer.pt')) && !existsSync(join(out, 'trainer_state.json')));
  for (const f of ['config.json', 'model.safetensors', 'tokenizer.json'])
    assert.ok(readFileSync(join(out, f)).equals(readFileSync(join(ckpt, f))), f);
  const msgs = [{ role: 'user' as const, content: 'What is 2+3?' }];
  const opts = { tools: [PYTHON_TOOL_SCHEMA], addGenerationPrompt: true };
  const exported = ChatTemplate.fromTokenizer(Tokenizer.load(out)).render(msgs, opts);
  assert.equal(exported, ChatTemplate.named('compact').render(msgs, opts));
  assert.equal(
    readFileSync(join(out, 'chat_template.jinja'), 'utf8'),
    JSON.parse(readFileSync(join(out, 'tokenizer_config.json'), 'utf8')).chat_template,
  );
  // outside a run the template must be named; a used directory is refused
  const loose = join(dir, 'loose');
  cpSync(ckpt, loose, { recursive: true });
  assert.match(
    rstar2(['export', loose, '--out', join(dir, 'x')]).stderr,
    /give --template rstar2\|qwen\|compact\|quick\|model/,
  );
  assert.match(rstar2(['export', ckpt, '--out', out]).stderr, /exists and is not empty/);
});
