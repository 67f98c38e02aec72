import { createInterface } from 'node:readline';
import type { Command } from 'commander';
import { deprecatedAliases, float, positiveInt, seed } from '../cli/index.js';

interface ChatFlags {
  model?: string;
  engine?: string;
  backend: string;
  tokenizer?: string;
  template: string;
  sandbox: string;
  temperature: number;
  topP: number;
  maxResponseTokens: number;
  maxTurns: number;
  tool: boolean;
  seed?: number;
  prompt?: string;
  color?: boolean;
}

export function registerChatCommands(program: Command): void {
  const chat = program
    .command('chat')
    .description(
      'talk to a model in the terminal; its Python tool calls run in the sandbox (thinking, code, output, answer shown apart)',
    )
    .option('--model <dir>', 'checkpoint directory (embedded engine)')
    .option(
      '--engine <spec>',
      'served engine: sglang+http://h:p, vllm+…, llamacpp+…, a plain URL (see --backend), or fake:ACC',
    )
    .option('--backend <name>', 'backend of a plain --engine URL: sglang, vllm, llamacpp', 'sglang')
    .option('--tokenizer <path>', 'tokenizer.json or its directory (default: --model)')
    .option('--template <name>', 'chat template: rstar2, qwen, compact, tokenizer, or a file', 'rstar2')
    .option('--sandbox <where>', "'embedded' (local bubblewrap pool) or a sandbox service URL", 'embedded')
    .option('--temperature <t>', 'sampling temperature', float({ min: 0 }), 1.0)
    .option('--top-p <p>', 'nucleus sampling top-p', float({ min: 0, minExclusive: true, max: 1 }), 1.0)
    .option(
      '--max-response-tokens <n>',
      'response budget per answer, tool tokens included',
      positiveInt(),
      8192,
    )
    .option('--max-turns <n>', 'assistant turns per answer', positiveInt(), 5)
    .option('--seed <n>', 'sampling seed (default: random per message)', seed())
    .option(
      '--no-tool',
      'prompts show no tool and no call is parsed or run (a model trained with tool.enabled: false)',
    )
    .option('--prompt <text>', 'ask one question, print the answer and exit')
    .option('--no-color', 'plain output');
  deprecatedAliases(chat, { '--max-tokens <n>': '--max-response-tokens' });
  chat.action(async (f: ChatFlags) => {
    const { openPolicy } = await import('../eval/index.js');
    const { colorWanted, renderAnswer } = await import('./render.js');
    const { ask } = await import('./session.js');
    const { visible } = await import('../util/terminal.js');
    const color = colorWanted(process.stdout, f.color);
    // status lines carry error messages that may quote model or tool text: shown, not obeyed
    const status = (s: string) =>
      process.stderr.write(color ? `\x1b[2m${visible(s)}\x1b[0m\n` : `${visible(s)}\n`);
    const policy = await openPolicy({
      model: f.model,
      engine: f.engine,
      backend: f.backend,
      tokenizer: f.tokenizer,
      template: f.template,
      sandbox: f.sandbox,
      temperature: f.temperature,
      topP: f.topP,
      maxTokens: f.maxResponseTokens,
      maxTurns: f.maxTurns,
      tools: f.tool ? undefined : [],
      concurrency: 1,
      onTool: (_req, res) => status(`  ▸ python ran: ${res.status} (${res.wallMs} ms)`),
    });
    let n = 0;
    const answer = async (text: string, signal?: AbortSignal) => {
      status('  … thinking');
      const seed = f.seed !== undefined ? f.seed + n++ : Math.floor(Math.random() * 2 ** 31);
      const t = await ask(policy, text, seed, signal);
      process.stdout.write(renderAnswer(t, { color, width: process.stdout.columns }));
    };
    try {
      if (f.prompt !== undefined) {
        await answer(f.prompt);
        return;
      }
      await interactive(answer, status, policy.name);
    } finally {
      await policy.close();
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
