// Regenerates data/samples/: small integer-arithmetic word problems in the three shapes real data comes in
// (a verl Parquet file, a DAPO-Math JSONL, an SFT chat JSONL with tool calls). Deterministic; the tool responses
// are what the sandboxed python tool returns for each call, with the execution time pinned to 0.01s.
// Usage: npx tsx scripts/make-data-fixtures.ts   (needs the sandbox: bubblewrap, python3)
import { mkdirSync, writeFileSync } from 'node:fs';
import { parquetWriteFile } from 'hyparquet-writer';
import { DAPO_PREFIX, DAPO_SUFFIX } from '../src/data/problem.js';
import { SandboxPool } from '../src/sandbox/pool.js';
import { executePythonTool, PYTHON_TOOL_NAME } from '../src/sandbox/tool.js';
import { Rng } from '../src/util/rng.js';

const DIR = 'data/samples';

interface Arith {
  question: string;
  expr: string; // the Python expression that computes the answer, written with the question's numbers
  answer: number;
}

const KINDS: ((r: Rng) => Arith)[] = [
  (r) => {
    const [a, b] = [r.int(12, 99), r.int(11, 99)];
    return {
      question: `A farmer plants ${a} rows of ${b} trees each. How many trees does the farmer plant?`,
      expr: `${a}*${b}`,
      answer: a * b,
    };
  },
  (r) => {
    const [a, b] = [r.int(100, 999), r.int(100, 999)];
    return {
      question: `A library has ${a} books and buys ${b} more. How many books does it have now?`,
      expr: `${a}+${b}`,
      answer: a + b,
    };
  },
  (r) => {
    const [a, b] = [r.int(12, 99), r.int(12, 99)];
    return {
      question: `Each box holds ${a} pencils. How many pencils are in ${b} boxes?`,
      expr: `${a}*${b}`,
      answer: a * b,
    };
  },
  (r) => {
    const [a, b] = [r.int(100, 999), r.int(100, 999)];
    return {
      question: `A train travels ${a} km on Monday and ${b} km on Tuesday. How many km does it travel in total?`,
      expr: `${a}+${b}`,
      answer: a + b,
    };
  },
  (r) => {
    const a = r.int(300, 999);
    const b = r.int(100, a - 1);
    return {
      question: `A school has ${a} students and ${b} of them go on a trip. How many students stay at school?`,
      expr: `${a}-${b}`,
      answer: a - b,
    };
  },
  (r) => {
    const [a, b] = [r.int(12, 99), r.int(12, 60)];
    return {
      question: `A baker makes ${a} cookies a day. How many cookies does the baker make in ${b} days?`,
      expr: `${a}*${b}`,
      answer: a * b,
    };
  },
  (r) => {
    const [a, b, c] = [r.int(10, 99), r.int(10, 99), r.int(10, 99)];
    return {
      question: `Sam has ${a} stickers, Lee has ${b} and Mia has ${c}. How many stickers do they have together?`,
      expr: `${a}+${b}+${c}`,
      answer: a + b + c,
    };
  },
];

// One stream of distinct questions, split into the three files, so no question is in two of them.
const rng = new Rng(20260512);
const seen = new Set<string>();
const all: Arith[] = [];
while (all.length < 90) {
  const p = rng.pick(KINDS)(rng);
  if (seen.has(p.question)) continue;
  seen.add(p.question);
  all.push(p);
}
const [verl, dapo, sft] = [all.slice(0, 30), all.slice(30, 60), all.slice(60, 90)];
mkdirSync(DIR, { recursive: true });

// verl: the columns examples/data_preprocess/gsm8k.py writes, as pyarrow lays them out (prompt a list of
// structs, reward_model and extra_info structs). Every fifth row opens with a system message.
const str = (name: string) =>
  ({ name, type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' }) as const;
parquetWriteFile({
  filename: `${DIR}/verl-arith.parquet`,
  columnData: [
    { name: 'data_source', data: verl.map(() => 'rstar2/arith') },
    {
      name: 'prompt',
      data: verl.map((p, i) => [
        ...(i % 5 === 0 ? [{ content: 'You are a careful calculator.', role: 'system' }] : []),
        { content: p.question, role: 'user' },
      ]),
    },
    { name: 'ability', data: verl.map(() => 'math') },
    { name: 'reward_model', data: verl.map((p) => ({ ground_truth: String(p.answer), style: 'rule' })) },
    {
      name: 'extra_info',
      data: verl.map((p, i) => ({
        answer: `${p.expr} = ${p.answer}\n#### ${p.answer}`,
        index: BigInt(i),
        question: p.question,
        split: 'train',
      })),
    },
  ],
  schema: [
    { name: 'schema', num_children: 5 },
    str('data_source'),
    { name: 'prompt', repetition_type: 'OPTIONAL', converted_type: 'LIST', num_children: 1 },
    { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
    { name: 'element', repetition_type: 'OPTIONAL', num_children: 2 },
    str('content'),
    str('role'),
    str('ability'),
    { name: 'reward_model', repetition_type: 'OPTIONAL', num_children: 2 },
    str('ground_truth'),
    str('style'),
    { name: 'extra_info', repetition_type: 'OPTIONAL', num_children: 4 },
    str('answer'),
    { name: 'index', type: 'INT64', repetition_type: 'OPTIONAL' },
    str('question'),
    str('split'),
  ],
});

// DAPO-Math-17k's row shape, with its instruction wrapper and a uuid index.
const uuid = () => {
  const h = Array.from({ length: 32 }, () => rng.int(0, 15).toString(16)).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-4${h.slice(13, 16)}-a${h.slice(17, 20)}-${h.slice(20)}`;
};
const jsonl = (rows: unknown[]) => rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
writeFileSync(
  `${DIR}/dapo-arith.jsonl`,
  jsonl(
    dapo.map((p) => ({
      data_source: 'math_dapo',
      prompt: [{ content: `${DAPO_PREFIX}${p.question}${DAPO_SUFFIX}`, role: 'user' }],
      ability: 'MATH',
      reward_model: { ground_truth: String(p.answer), style: 'rule-lighteval/MATH_v2' },
      extra_info: { index: uuid() },
    })),
  ),
);

// SFT: mostly one call then the answer; some recover from a misspelt call first; a few answer directly.
// Assistant content follows the rStar2 format after the `<reason>` the generation prompt opens.
const pool = await SandboxPool.start();
const toolText = async (code: string) =>
  (await executePythonTool({ code, input: '' }, pool)).text.replace(
    /execution time: \d+\.\d+s$/,
    'execution time: 0.01s',
  );
const answer = (a: number) => `</reason> <answer> \\boxed{${a}} </answer>`;
const rows: unknown[] = [];
try {
  for (const [i, p] of sft.entries()) {
    const style = i % 10 === 9 ? 'direct' : i % 5 === 3 ? 'recover' : 'tool';
    const messages: unknown[] = [{ role: 'user', content: p.question }];
    if (style === 'direct') {
      messages.push({ role: 'assistant', content: `${p.expr} = ${p.answer}${answer(p.answer)}` });
    } else {
      const codes = style === 'recover' ? [`prnt(${p.expr})`, `print(${p.expr})`] : [`print(${p.expr})`];
      for (const [k, code] of codes.entries()) {
        const id = `call_${i}_${k}`;
        // OpenAI sends arguments as a JSON string; every third example uses an object, as some exports do.
        const args = i % 3 === 2 ? { code, input: '' } : JSON.stringify({ code, input: '' });
        messages.push({
          role: 'assistant',
          content: k === 0 ? `${p.expr}</reason>` : '</reason>',
          tool_calls: [{ id, type: 'function', function: { name: PYTHON_TOOL_NAME, arguments: args } }],
        });
        messages.push({ role: 'tool', tool_call_id: id, content: await toolText(code) });
      }
      messages.push({ role: 'assistant', content: answer(p.answer) });
    }
    rows.push({ messages });
  }
} finally {
  await pool.close();
}
writeFileSync(`${DIR}/sft-arith-tools.jsonl`, jsonl(rows));
console.log(`wrote ${DIR}/verl-arith.parquet, dapo-arith.jsonl, sft-arith-tools.jsonl (30 rows each)`);
