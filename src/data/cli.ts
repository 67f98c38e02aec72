import type { Command } from 'commander';
import { positiveInt } from '../cli/index.js';
import { PYTHON_TOOL_NAME } from '../tokenizer/tools.js';
import { visible } from '../util/terminal.js';
import type { Message, SftLayout } from './chat.js';
import { isLayout, LAYOUTS, type Layout, SFT_TEMPLATES, type SftTemplate } from './layouts.js';
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

interface SftInspectOptions {
  limit?: number;
  show: number;
  template: string;
  rlTemplate: string;
  tokenizer?: string;
  toolName: string;
}

/** What `data inspect --sft` reports: counts, the tools called, and the first examples exactly as rendered. */
async function sftReport(file: string, o: SftInspectOptions) {
  const { calledToolNames, loadChatExamples } = await import('./chat.js');
  const { SFT_TEMPLATES, sftRenderer, toolUse, unservedToolsWarning } = await import('./sft.js');
  const { ChatTemplate, Tokenizer, rolloutToolSchema } = await import('../tokenizer/index.js');
  const { namedTokenizerDir } = await import('../tokenizer/index.js');
  if (!(SFT_TEMPLATES as readonly string[]).includes(o.template))
    throw new Error(`--template must be one of ${SFT_TEMPLATES.join(', ')}, got '${o.template}'`);
  const template = o.template as SftTemplate;
  const tokenizer = o.tokenizer
    ? Tokenizer.load(o.tokenizer === 'qwen3' ? namedTokenizerDir('qwen3') : o.tokenizer)
    : undefined;
  if (template === 'model' && !tokenizer)
    throw new Error("--template model renders with the model's own chat template: give --tokenizer DIR");
  const tool = rolloutToolSchema(o.toolName);
  const sft = sftRenderer({
    rl: ChatTemplate.resolve(o.rlTemplate, tokenizer),
    tokenizer,
    rolloutTools: [tool],
  });
  const layouts: Partial<Record<SftLayout, number>> = {};
  const examples = await loadChatExamples(file, { limit: o.limit, layouts });
  const count = (pred: (m: Message, prev?: Message) => boolean) =>
    examples.reduce((n, ex) => n + ex.messages.filter((m, i) => pred(m, ex.messages[i - 1])).length, 0);
  const use = toolUse(examples);
  const first = examples.slice(0, o.show).map((ex, i) => {
    let pieces: { text: string; train: boolean; tokens?: number }[];
    try {
      pieces = sft.pieces(ex, template);
    } catch (e) {
      throw new Error(`example ${i + 1}: template ${template}: ${(e as Error).message}`);
    }
    if (tokenizer)
      pieces = pieces.map((p) => ({
        ...p,
        tokens: tokenizer.encode(p.text, { addSpecialTokens: false }).length,
      }));
    return { tools: ex.tools?.map((t) => t.function.name) ?? [], pieces };
  });
  return {
    examples: examples.length,
    layouts,
    assistantTurns: count((m) => m.role === 'assistant'),
    toolTurns: count((m, prev) => m.role === 'tool' && prev?.role !== 'tool'),
    withToolCalls: examples.filter((ex) => calledToolNames(ex).length > 0).length,
    withOwnTools: examples.filter((ex) => ex.tools).length,
    template,
    tools: use,
    warning: unservedToolsWarning(use, tool.function.name),
    first,
  };
}

// Trained text between these marks in `data inspect --sft`; brackets no chat template writes.
const OPEN = '⟦';
const CLOSE = '⟧';

function printSft(r: Awaited<ReturnType<typeof sftReport>>): void {
  console.log(
    `examples: ${r.examples}  assistantTurns: ${r.assistantTurns}  toolTurns: ${r.toolTurns}  ` +
      `withToolCalls: ${r.withToolCalls}  withOwnTools: ${r.withOwnTools}`,
  );
  console.log(
    `layout: ${Object.entries(r.layouts)
      .map(([k, n]) => `${k} (${n} rows)`)
      .join(', ')}`,
  );
  if (r.tools.length)
    console.log(`tools called: ${r.tools.map((u) => `${u.name || '(no name)'} ×${u.calls}`).join(', ')}`);
  if (r.warning) console.log(`warning: ${r.warning}`);
  console.log(
    `template: ${r.template}; ${OPEN}…${CLOSE} is trained (the loss is on it), everything else is read (masked)`,
  );
  for (const [i, ex] of r.first.entries()) {
    const tokens = ex.pieces.every((p) => p.tokens !== undefined)
      ? `: ${ex.pieces.reduce((n, p) => n + (p.tokens ?? 0), 0)} tokens, ${ex.pieces.reduce((n, p) => n + (p.train ? (p.tokens ?? 0) : 0), 0)} trained`
      : '';
    const spans = ex.pieces.filter((p) => p.train).length;
    console.log(
      `\n--- example ${i + 1}${tokens} in ${spans} span${spans === 1 ? '' : 's'}${ex.tools.length ? `; its tools: ${ex.tools.join(', ')}` : ''}`,
    );
    console.log(ex.pieces.map((p) => (p.train ? `${OPEN}${p.text}${CLOSE}` : p.text)).join(''));
  }
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
    .option(
      '--sft',
      'the file is SFT chat data ({messages, tools?}, ShareGPT {conversations, tools?}, xLAM {query, tools, answers}, ' +
        '{instruction, output}, ...): shows each of the first --show examples as the SFT stage renders it, the trained ' +
        'text marked, and the tools the data calls',
    )
    .option(
      '--template <name>',
      `with --sft: ${SFT_TEMPLATES.join(', ')}, as an SFT stage's template (rl: as rollouts of --rl-template; ` +
        "model: the tokenizer's own chat template, whole conversations; qwen: Qwen2.5's)",
      'rl',
    )
    .option('--rl-template <name>', "with --sft: the recipe's chat template 'rl' renders with", 'rstar2')
    .option(
      '--tokenizer <dir>',
      "with --sft: a model directory or tokenizer.json (or qwen3): token counts, and --template model's template",
    )
    .option(
      '--tool-name <name>',
      'with --sft: the tool RL rollouts serve (recipe tool.name)',
      PYTHON_TOOL_NAME,
    )
    .option('--json', 'print the report as JSON')
    .action(async (file: string, o) => {
      if (o.sft) {
        const report = await sftReport(file, {
          limit: o.limit,
          show: o.show,
          template: o.template,
          rlTemplate: o.rlTemplate,
          tokenizer: o.tokenizer,
          toolName: o.toolName,
        });
        if (o.json) console.log(JSON.stringify(report, null, 2));
        else printSft(report);
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
