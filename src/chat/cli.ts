import { createInterface } from 'node:readline';
import { type Command, InvalidArgumentError } from 'commander';
import { openBackend } from '../eval/backend.js';
import { colorWanted, renderAnswer } from './render.js';
import { ask } from './session.js';

const num =
  (name: string, lo: number, hi: number, int = false) =>
  (v: string) => {
    const x = Number(v);
    if (v.trim() === '' || !Number.isFinite(x) || x < lo || x > hi || (int && !Number.isInteger(x))) {
      throw new InvalidArgumentError(`${name} must be ${int ? 'an integer' : 'a number'} in [${lo}, ${hi}]`);
    }
    return x;
  };

interface ChatFlags {
  model?: string;
  engine?: string;
  backend: string;
  tokenizer?: string;
  template: string;
  sandbox: string;
  temperature: number;
  topP: number;
  maxTokens: number;
  maxTurns: number;
  seed?: number;
  prompt?: string;
  color?: boolean;
}

export function registerChatCommands(program: Command): void {
  program
    .command('chat')
    .description(
      'talk to a model in the terminal; its Python tool calls run in the sandbox (thinking, code, output, answer shown apart)',
    )
    .option('--model <dir>', 'checkpoint directory (embedded engine)')
    .option(
      '--engine <url>',
      'served engine: sglang+http://h:p, vllm+…, llamacpp+…, a plain URL, or fake:ACC',
    )
    .option('--backend <name>', 'backend of a plain --engine URL: sglang, vllm, llamacpp', 'sglang')
    .option('--tokenizer <path>', 'tokenizer.json or its directory (default: --model)')
    .option('--template <name>', 'chat template: rstar2, qwen, compact, tokenizer, or a file', 'rstar2')
    .option('--sandbox <where>', "'embedded' (local bubblewrap pool) or a sandbox service URL", 'embedded')
    .option('--temperature <t>', 'sampling temperature', num('--temperature', 0, 10), 1.0)
    .option('--top-p <p>', 'nucleus sampling top-p', num('--top-p', 0, 1), 1.0)
    .option(
      '--max-tokens <n>',
      'response budget per answer, tool tokens included',
      num('--max-tokens', 1, 1e7, true),
      8192,
    )
    .option('--max-turns <n>', 'assistant turns per answer', num('--max-turns', 1, 1000, true), 5)
    .option('--seed <n>', 'sampling seed (default: random per message)', num('--seed', 0, 2 ** 31, true))
    .option('--prompt <text>', 'ask one question, print the answer and exit')
    .option('--no-color', 'plain output')
    .action(async (f: ChatFlags) => {
      const color = colorWanted(process.stdout, f.color);
      const status = (s: string) => process.stderr.write(color ? `\x1b[2m${s}\x1b[0m\n` : `${s}\n`);
      const backend = await openBackend({
        model: f.model,
        engine: f.engine,
        backend: f.backend,
        tokenizer: f.tokenizer,
        template: f.template,
        sandbox: f.sandbox,
        temperature: f.temperature,
        topP: f.topP,
        maxTokens: f.maxTokens,
        maxTurns: f.maxTurns,
        concurrency: 1,
        onTool: (_req, res) => status(`  ▸ python ran: ${res.status} (${res.wallMs} ms)`),
      });
      let n = 0;
      const answer = async (text: string, signal?: AbortSignal) => {
        status('  … thinking');
        const seed = f.seed !== undefined ? f.seed + n++ : Math.floor(Math.random() * 2 ** 31);
        const t = await ask(backend, text, seed, signal);
        process.stdout.write(renderAnswer(t, { color, width: process.stdout.columns }));
      };
      try {
        if (f.prompt !== undefined) {
          await answer(f.prompt);
          return;
        }
        await interactive(answer, status, backend.name);
      } finally {
        await backend.close();
      }
    });
}

async function interactive(
  answer: (text: string, signal?: AbortSignal) => Promise<void>,
  status: (s: string) => void,
  name: string,
): Promise<void> {
  const tty = Boolean(process.stdin.isTTY);
  const rl = createInterface({ input: process.stdin, output: process.stdout, terminal: tty });
  status(
    `rstar2 chat with ${name} — each message is answered on its own; /exit or Ctrl-D to quit, Ctrl-C stops an answer`,
  );
  let current: AbortController | null = null;
  rl.on('SIGINT', () => {
    if (current) current.abort();
    else rl.close();
  });
  rl.setPrompt('you> ');
  if (tty) rl.prompt();
  for await (const line of rl) {
    const text = line.trim();
    if (text === '/exit' || text === '/quit') break;
    if (text !== '') {
      current = new AbortController();
      try {
        await answer(text, current.signal);
      } catch (e) {
        status(`error: ${(e as Error).message}`);
      } finally {
        current = null;
      }
    }
    if (tty) rl.prompt();
  }
  rl.close();
}
