import type { AgentTemplate } from '../../src/agent/loop.js';
import { FakeEngine } from '../../src/engines/fake.js';
import type { CodeRunner, RunRequest, RunResult } from '../../src/sandbox/types.js';
import type { Tokenizer } from '../../src/tokenizer/index.js';

// A tiny deterministic tokenizer/template for loop tests: two special tokens, every other char is
// its own id, so decode(encode(s)) === s and token counts are easy to reason about.
export const IM_START = 1;
export const IM_END = 2;
const SPECIAL: Record<string, number> = { '<|im_start|>': IM_START, '<|im_end|>': IM_END };
const BY_ID = new Map(Object.entries(SPECIAL).map(([k, v]) => [v, k]));

export function encode(s: string): number[] {
  const out: number[] = [];
  for (let i = 0; i < s.length; ) {
    const sp = Object.keys(SPECIAL).find((k) => s.startsWith(k, i));
    if (sp) {
      out.push(SPECIAL[sp]);
      i += sp.length;
    } else {
      out.push(300 + s.charCodeAt(i));
      i++;
    }
  }
  return out;
}

export function decode(ids: number[]): string {
  return ids.map((id) => BY_ID.get(id) ?? String.fromCharCode(id - 300)).join('');
}

export const GEN_PROMPT = '<|im_start|>assistant\n<reason>';

export const template: AgentTemplate = {
  promptIds: (q) => encode(`<|im_start|>user\n${q}<|im_end|>\n${GEN_PROMPT}`),
  toolTurnIds: (texts) =>
    encode(
      `<|im_start|>user${texts.map((t) => `\n<tool_response>\n${t}\n</tool_response>`).join('')}<|im_end|>\n${GEN_PROMPT}`,
    ),
  decode,
  stopTokenIds: [IM_END],
  turnSeparatorIds: encode('\n'),
};

export function okResult(stdout: string): RunResult {
  return {
    status: 'ok',
    exitCode: 0,
    signal: null,
    stdout,
    stderr: '',
    truncated: false,
    timedOut: false,
    oom: false,
    wallMs: 10,
    cpuMs: 5,
    peakMemoryKb: 1000,
  };
}

/** Records every request; answers with `reply` (default stdout "2\n") after `delayMs`. */
export class FakeRunner implements CodeRunner {
  requests: RunRequest[] = [];
  batchSizes: number[] = [];
  constructor(
    private readonly reply: (req: RunRequest) => RunResult = () => okResult('2\n'),
    private readonly delayMs = 0,
    private readonly failBatches = false,
  ) {}
  async run(req: RunRequest): Promise<RunResult> {
    return (await this.runBatch([req]))[0];
  }
  async runBatch(reqs: RunRequest[]): Promise<RunResult[]> {
    this.requests.push(...reqs);
    this.batchSizes.push(reqs.length);
    if (this.delayMs) await new Promise((r) => setTimeout(r, this.delayMs));
    if (this.failBatches) throw new Error('sandbox exploded');
    return reqs.map((r) => this.reply(r));
  }
  async close(): Promise<void> {}
}

export const CALL =
  '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(1+1)", "input": ""}}\n</tool_call>';

/** A scripted model on `tok`: calls python (`print(6*7)`) first, then answers `answer(printed)`, where printed
 *  is what the tool printed, if anything. */
export function pythonThenAnswer(tok: Tokenizer, answer: (printed?: string) => string): FakeEngine {
  const call =
    '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(6*7)", "input": ""}}\n</tool_call><|im_end|>';
  return new FakeEngine((ids) => {
    const seen = tok.decode(ids);
    const text = seen.includes('<tool_response>')
      ? answer(/stdout: (\d+)/.exec(seen)?.[1])
      : `Compute it.\n${call}`;
    return { outputIds: tok.encode(text, { addSpecialTokens: false }) };
  });
}
