import type { Command } from 'commander';
import { positiveInt } from '../cli/options.js';
import { visible } from '../util/terminal.js';
import type { ChatExample } from './chat.js';
import { isLayout, LAYOUTS, type Layout } from './layouts.js';
import type { DataReport } from './load.js';

const clip = (s: string, n = 160) => {
  // dataset text (model answers in SFT rows among it) is shown, never obeyed by the terminal
  const flat = visible(s.replaceAll('\n', '\\n'));
  return flat.length > n ? `${flat.slice(0, n)}…` : flat;
};

function printReport(r: DataReport): void {
  const layouts = Object.entries(r.layouts).map(([k, n]) => `${k} (${n} rows)`);
  console.log(`files: ${r.files.length}${r.files.length <= 5 ? ` (${r.files.join(', ')})` : ''}`);
  console.log(`layout: ${layouts.join(', ')}`);
  console.log(
    `rows: ${r.rows}  with answer: ${r.withAnswer}  integer answers: ${r.integerAnswers}  ` +
      `duplicate questions: ${r.duplicateQuestions}`,
  );
  for (const p of r.first) {
    console.log(`\nid: ${p.id}${p.source ? `  source: ${p.source}` : ''}`);
    console.log(`question: ${clip(p.question)}`);
    console.log(`answer: ${visible(p.answer ?? '(none)')}`);
    if (p.meta) console.log(`meta: ${clip(JSON.stringify(p.meta))}`);
  }
}

async function sftReport(examples: ChatExample[], show: number) {
  const { chatSegments } = await import('./chat.js');
  const segs = examples.map((ex) => chatSegments(ex));
  const count = (role: string) =>
    segs.reduce((n, s) => n + s.segments.filter((g) => g.role === role).length, 0);
  return {
    examples: examples.length,
    assistantTurns: count('assistant'),
    toolTurns: count('tool'),
    withToolCalls: segs.filter((s) => s.segments.some((g) => g.role === 'tool')).length,
    first: segs.slice(0, show),
  };
}

export function registerDataCommands(program: Command): void {
  const data = program.command('data').description('training and evaluation data files');
  data
    .command('convert')
    .description(
      'convert between JSONL and Parquet, a row at a time (no pyarrow needed): every row of the input written ' +
        'to the output, whose name (.parquet, .jsonl) says the format. Parquet is written with Snappy, one type ' +
        'per column (read from every row first); nested fields become Parquet structs and lists, as verl writes',
    )
    .argument('<input>', 'a .jsonl/.parquet file, a directory of them, or a glob (quote it)')
    .argument('<output>', 'the file to write: out.parquet or out.jsonl')
    .action(async (input: string, output: string) => {
      const { convertData } = await import('./convert.js');
      const r = await convertData(input, output);
      console.log(`wrote ${r.rows} rows from ${r.files.length} file(s) to ${output}`);
    });
  data
    .command('inspect')
    .description(
      'read a problem file (or SFT chat data with --sft) the way training and rollouts will, and show what ' +
        'came out: the layout detected, the first rows as mapped, and counts (rows, with answer, integer ' +
        'answers, duplicate questions). Reads JSONL and Parquet; errors name the file, line or row, and field.',
    )
    .argument('<file>', 'a .jsonl/.parquet file, a directory of them, or a glob (quote it: "data/*.parquet")')
    .option(
      '--layout <name>',
      `row layout: ${LAYOUTS.join(', ')}, or auto (detected per row). verl: prompt chat list + ` +
        'reward_model.ground_truth; dapo: verl with the DAPO-Math instruction stripped; plain: ' +
        '{id?, problem|question|prompt, answer|gold|solution?}',
      'auto',
    )
    .option(
      '--map <fields>',
      'read fields from other (dotted) paths, e.g. question=q,answer=extra_info.gt (keys: id, question, answer, source)',
    )
    .option('--limit <n>', 'read only the first n rows', positiveInt())
    .option('--show <n>', 'rows to print', positiveInt(), 3)
    .option('--require-answer', 'fail on a row without a gold answer, as RL and eval loading do')
    .option('--sft', 'the file is SFT chat data ({messages}, {instruction, output}, {prompt, response}, ...)')
    .option('--json', 'print the report as JSON')
    .action(async (file: string, o) => {
      if (o.sft) {
        const { loadChatExamples } = await import('./chat.js');
        const report = await sftReport(await loadChatExamples(file, { limit: o.limit }), o.show);
        if (o.json) console.log(JSON.stringify(report, null, 2));
        else {
          const { first, ...counts } = report;
          console.log(
            Object.entries(counts)
              .map(([k, v]) => `${k}: ${v}`)
              .join('  '),
          );
          for (const ex of first) {
            console.log('');
            for (const m of ex.prompt) console.log(`${m.role}: ${clip(m.content)}`);
            for (const s of ex.segments)
              console.log(`${s.role}: ${clip(s.role === 'tool' ? s.texts.join(' | ') : s.text)}`);
          }
        }
        return;
      }
      if (o.layout !== 'auto' && !isLayout(o.layout)) {
        throw new Error(`--layout must be auto or one of ${LAYOUTS.join(', ')}, got '${o.layout}'`);
      }
      const { inspectProblems } = await import('./load.js');
      const { parseFieldMap } = await import('./problem.js');
      const report = await inspectProblems(file, {
        layout: o.layout as Layout | 'auto',
        map: o.map ? parseFieldMap(o.map) : undefined,
        limit: o.limit,
        show: o.show,
        requireAnswer: Boolean(o.requireAnswer),
      });
      if (o.json) console.log(JSON.stringify(report, null, 2));
      else printReport(report);
    });
}
