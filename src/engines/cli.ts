import type { Command } from 'commander';
import { int, port, positiveInt } from '../cli/index.js';
import { resolveToken, TOKEN_ENV } from '../util/http-guard.js';
import { PRECISIONS, type Precision } from '../worker/types.js';

export function registerServeCommand(program: Command): void {
  program
    .command('serve')
    .description(
      "serve a model directory on the built-in engine over SGLang's native HTTP API (what --engines sglang+URL " +
        'drives, weight updates included) and OpenAI /v1/completions, /v1/chat/completions; /metrics',
    )
    .requiredOption(
      '--model <dir>',
      'Hugging Face model directory (config.json, safetensors, tokenizer.json)',
    )
    .option('--host <addr>', 'address to bind', '127.0.0.1')
    .option('--port <port>', 'TCP port (0 = any free port)', port(), 30000)
    .option('--served-model-name <name>', "the model's name in /v1/models (default: the directory's name)")
    .option('--precision <name>', `weights and compute: ${PRECISIONS.join(' | ')}`, 'fp32')
    .option('--threads <n>', 'torch threads of the worker', positiveInt(), 2)
    .option(
      '--bucket-timeout <s>',
      "how long one bucket of a trainer's weight broadcast may take to arrive before the update fails (the old weights serve on)",
      int({ min: 1 }),
      60,
    )
    .option('--token <token>', `require 'Authorization: Bearer <token>' (default $${TOKEN_ENV})`)
    .action(
      async (o: {
        model: string;
        host: string;
        port: number;
        servedModelName?: string;
        precision: string;
        threads: number;
        bucketTimeout: number;
        token?: string;
      }) => {
        if (!(PRECISIONS as readonly string[]).includes(o.precision))
          throw new Error(`--precision must be one of ${PRECISIONS.join(', ')}, got ${o.precision}`);
        const { serve } = await import('./serve.js');
        const token = resolveToken(o.token);
        const s = await serve({
          model: o.model,
          host: o.host,
          port: o.port,
          bucketTimeoutS: o.bucketTimeout,
          ...(o.servedModelName ? { servedName: o.servedModelName } : {}),
          ...(token ? { token } : {}),
          worker: { threads: o.threads, precision: o.precision as Precision },
        });
        console.log(`rstar2 serve: ${s.url}  (Ctrl-C to stop)`);
        const stop = () => void s.close().then(() => process.exit(0));
        process.once('SIGINT', stop);
        process.once('SIGTERM', stop);
      },
    );
}
