import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Command } from 'commander';
import { positiveInt } from '../cli/index.js';
import { TEMPLATE_NAMES, type TemplateName } from './templates.js';

// Corpus documents: a .jsonl file gives one document per record (all its string fields joined by newlines);
// any other file is one document per non-empty line.
function readCorpus(paths: string[]): string[] {
  const docs: string[] = [];
  for (const p of paths) {
    const text = readFileSync(p, 'utf8');
    const lines = text.split('\n').filter((l) => l.trim().length > 0);
    if (!p.endsWith('.jsonl')) {
      docs.push(...lines);
      continue;
    }
    lines.forEach((line, i) => {
      let rec: unknown;
      try {
        rec = JSON.parse(line);
      } catch (e) {
        throw new Error(`${p}:${i + 1}: not valid JSON: ${(e as Error).message}`);
      }
      const strings: string[] = [];
      const walk = (v: unknown): void => {
        if (typeof v === 'string') strings.push(v);
        else if (Array.isArray(v)) v.forEach(walk);
        else if (v && typeof v === 'object') Object.values(v).forEach(walk);
      };
      walk(rec);
      docs.push(strings.join('\n'));
    });
  }
  return docs;
}

function templateOption(name: string): TemplateName {
  if (!(TEMPLATE_NAMES as string[]).includes(name)) {
    throw new Error(`--template must be one of ${TEMPLATE_NAMES.join(', ')}, got ${name}`);
  }
  return name as TemplateName;
}

export function registerTokenizerCommands(program: Command): void {
  const tok = program
    .command('tokenizer')
    .description('Build tokenizers for tiny models and inspect chat templates');

  tok
    .command('build')
    .description(
      'Write tokenizer.json + tokenizer_config.json: byte-level (char) or a BPE trained on a corpus',
    )
    .requiredOption('--out <dir>', 'output directory')
    .option('--kind <kind>', 'char | bpe', 'char')
    .option(
      '--corpus <files...>',
      'training text for bpe (.jsonl: one document per record; else one per line)',
    )
    .option(
      '--vocab-size <n>',
      'bpe vocabulary size, including the 256 bytes and the added tokens',
      positiveInt(),
      1024,
    )
    .option('--min-frequency <n>', 'bpe: stop when the best pair occurs fewer times', positiveInt(), 2)
    .option('--force', 'replace the tokenizer files --out already holds', false)
    .option(
      '--template <name>',
      `chat template stored in the config: ${TEMPLATE_NAMES.join(' | ')}`,
      'compact',
    )
    .action(
      async (o: {
        out: string;
        kind: string;
        corpus?: string[];
        vocabSize: number;
        minFrequency: number;
        template: string;
        force: boolean;
      }) => {
        // a model directory's tokenizer replaced by one of another vocabulary breaks that model for good
        const held = ['tokenizer.json', 'tokenizer_config.json'].filter((f) => existsSync(join(o.out, f)));
        if (held.length && !o.force)
          throw new Error(`${o.out} already holds ${held.join(' and ')} (pass --force to replace them)`);
        const { buildCharTokenizer, saveTokenizer, trainBpeTokenizer } = await import('./build.js');
        const { Tokenizer } = await import('./tokenizer.js');
        const template = templateOption(o.template);
        let files: ReturnType<typeof buildCharTokenizer>;
        if (o.kind === 'char') {
          files = buildCharTokenizer({ template });
        } else if (o.kind === 'bpe') {
          if (!o.corpus?.length) throw new Error('--kind bpe needs --corpus FILE...');
          files = trainBpeTokenizer(readCorpus(o.corpus), o.vocabSize, {
            template,
            minFrequency: o.minFrequency,
          });
        } else {
          throw new Error(`--kind must be char or bpe, got ${o.kind}`);
        }
        saveTokenizer(files, o.out);
        const loaded = Tokenizer.load(o.out);
        console.log(`${o.out}: ${o.kind} tokenizer, vocab ${loaded.vocabSize}, template ${template}`);
      },
    );

  tok
    .command('render')
    .description('Render a chat prompt for a question (with the python tool) and, given a tokenizer, its ids')
    .argument('<question>', 'the user message')
    .option(
      '--template <spec>',
      `${TEMPLATE_NAMES.join(' | ')} | tokenizer | path to .jinja/tokenizer_config.json`,
      'rstar2',
    )
    .option('--no-tools', 'render without the python tool schema')
    .option('--tokenizer <dir>', 'tokenizer directory: also print the token count and ids')
    .action(async (question: string, o: { template: string; tools: boolean; tokenizer?: string }) => {
      const { Tokenizer } = await import('./tokenizer.js');
      const { ChatTemplate } = await import('./chat.js');
      const { PYTHON_TOOL_SCHEMA } = await import('./tools.js');
      const tokenizer = o.tokenizer ? Tokenizer.load(o.tokenizer) : undefined;
      const tpl = ChatTemplate.resolve(o.template, tokenizer);
      const tools = o.tools ? [PYTHON_TOOL_SCHEMA] : undefined;
      const text = tpl.render([{ role: 'user', content: question }], { tools, addGenerationPrompt: true });
      process.stdout.write(`${text}\n`);
      if (tokenizer) {
        const ids = tokenizer.encode(text);
        console.error(`-- ${text.length} chars, ${ids.length} tokens`);
        console.error(JSON.stringify(ids));
      }
    });

  tok
    .command('template')
    .description('Print the Jinja source of a shipped chat template (to store as a .jinja file or edit)')
    .argument('<name>', TEMPLATE_NAMES.join(' | '))
    .action(async (name: string) => {
      const { ChatTemplate } = await import('./chat.js');
      process.stdout.write(ChatTemplate.named(name).source);
    });

  tok
    .command('encode')
    .description('Print the token ids of a text (and the pieces with --pieces)')
    .requiredOption('--tokenizer <dir>', 'tokenizer directory or tokenizer.json')
    .argument('<text>', 'text to encode')
    .option('--pieces', 'also print each id with its token string', false)
    .action(async (text: string, o: { tokenizer: string; pieces: boolean }) => {
      const { Tokenizer } = await import('./tokenizer.js');
      const t = Tokenizer.load(o.tokenizer);
      const ids = t.encode(text);
      console.log(JSON.stringify(ids));
      if (o.pieces) for (const id of ids) console.log(`${id}\t${JSON.stringify(t.tokenOf(id))}`);
    });

  tok
    .command('decode')
    .description('Print the text of comma- or space-separated token ids')
    .requiredOption('--tokenizer <dir>', 'tokenizer directory or tokenizer.json')
    .argument('<ids>', 'e.g. "1,2,3" or "[1, 2, 3]"')
    .option('--skip-special', 'drop special tokens', false)
    .action(async (idsText: string, o: { tokenizer: string; skipSpecial: boolean }) => {
      const { Tokenizer } = await import('./tokenizer.js');
      const parts = idsText
        .replace(/[[\]]/g, ' ')
        .split(/[\s,]+/)
        .filter(Boolean);
      const ids = parts.map((p) => {
        const n = Number(p);
        if (!Number.isInteger(n)) throw new Error(`not a token id: ${JSON.stringify(p)}`);
        return n;
      });
      const { forTerminal } = await import('../util/terminal.js');
      const text = Tokenizer.load(o.tokenizer).decode(ids, { skipSpecial: o.skipSpecial });
      process.stdout.write(forTerminal(`${text}\n`, process.stdout)); // model text: shown, not obeyed
    });
}
