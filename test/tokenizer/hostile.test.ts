import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { buildCharTokenizer, ChatTemplate, saveTokenizer, Tokenizer } from '../../src/tokenizer/index.js';

// A chat template comes with a model and is untrusted (issue 56 item 3). Before the render budget, the first
// of these took 72 s and 4.5 GB and ended the process with V8's fatal "heap out of memory" (exit 134).

const dir = mkdtempSync(join(tmpdir(), 'rstar2-hostile-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const HOSTILE: Record<string, string> = {
  'nested-range':
    '{% for i in range(100000000) %}{% for j in range(100000000) %}{{ i }}{% endfor %}{% endfor %}',
  // Each list is within bounds; the loops never end in time.
  'nested-loops':
    '{% for i in range(200000) %}{% for j in range(200000) %}{{ "xxxxxxxxxxxxxxxx" }}{% endfor %}{% endfor %}',
  'empty-loops': '{% for i in range(200000) %}{% for j in range(200000) %}{% endfor %}{% endfor %}',
  doubling: '{% set s = "x" %}{% for i in range(64) %}{% set s = s + s %}{% endfor %}{{ s }}',
  'filter-doubling':
    '{% set s = "x" %}{% for i in range(64) %}{% set s = s | replace("x", "xx") %}{% endfor %}{{ s }}',
  'method-doubling':
    '{% set s = "x" %}{% for i in range(64) %}{% set s = s.replace("x", "xx") %}{% endfor %}{{ s }}',
};
const msgs = [{ role: 'user' as const, content: 'hi' }];

test('hostile templates stop with an error naming the template, and the process renders on', {
  timeout: 120_000,
}, () => {
  for (const [name, src] of Object.entries(HOSTILE)) {
    const file = join(dir, `${name}.jinja`);
    writeFileSync(file, src);
    const tpl = ChatTemplate.resolve(file);
    const t0 = Date.now();
    assert.throws(
      () => tpl.render(msgs),
      (e: Error) => e.message.includes(`chat template ${file}: rendering stopped`),
      name,
    );
    // "within a few seconds" (the issue); the time limit is 3 s, this bound leaves room for a loaded host.
    assert.ok(Date.now() - t0 < 20_000, `${name} took ${Date.now() - t0} ms`);
  }
  // The budget is per render: ordinary templates, range() included, render as before.
  assert.match(ChatTemplate.named('rstar2').render(msgs), /This is the problem:\nhi<\|im_end\|>/);
  const counted = new ChatTemplate(
    '{% for i in range(3) %}{{ i }}{% endfor %}|{{ range(2, 9, 3) | join(",") }}',
  );
  assert.equal(counted.render(msgs), '012|2,5,8');
});

test("a model's own template that loops forever names the model's tokenizer", { timeout: 60_000 }, () => {
  const model = join(dir, 'model');
  saveTokenizer({ ...buildCharTokenizer(), config: { eos_token: '<|im_end|>' } }, model);
  writeFileSync(join(model, 'chat_template.jinja'), HOSTILE['empty-loops']);
  const tpl = ChatTemplate.fromTokenizer(Tokenizer.load(model));
  assert.throws(
    () => tpl.render(msgs),
    (e: Error) => e.message.includes(join(model, 'tokenizer.json')),
  );
});

test('rstar2 tokenizer render exits with the error, not a crash', { timeout: 120_000 }, () => {
  const file = join(dir, 'cli.jinja');
  writeFileSync(file, HOSTILE['nested-range']);
  const bin = join(import.meta.dirname, '../../bin/rstar2.js');
  const r = spawnSync(process.execPath, [bin, 'tokenizer', 'render', 'hi', '--template', file], {
    encoding: 'utf8',
    timeout: 100_000,
  });
  assert.equal(r.status, 1, `status ${r.status} signal ${r.signal}: ${r.stderr.slice(-2000)}`);
  assert.match(
    r.stderr,
    /chat template .*cli\.jinja: rendering stopped: it called range\(\) for 100000000 items/,
  );
});
