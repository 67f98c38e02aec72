import type { Command } from 'commander';
import { int, port } from '../cli/index.js';
import { resolveToken, TOKEN_ENV } from '../util/http-guard.js';

export function registerDashboardCommands(program: Command): void {
  program
    .command('dashboard')
    .description(
      'serve a local web dashboard over run and eval directories (curves, RoC, evals, trajectories; live)',
    )
    .option('--runs <dir>', 'directory holding run and/or eval directories (searched 3 levels deep)', '.')
    .option(
      '--evals <dir>',
      'also list the eval directories here, where rstar2 eval writes them (default: ./evals when --runs does not hold it)',
      'evals',
    )
    .option('--port <port>', 'TCP port (0 = any free port)', port(), 8090)
    .option(
      '--host <addr>',
      'address to bind (keep 127.0.0.1 unless you mean to share it); anything but loopback needs a token',
      '127.0.0.1',
    )
    .option(
      '--token <token>',
      `require this token (16+ characters; default $${TOKEN_ENV}). The printed URL carries it as ` +
        '?token=, which the page passes on to the API as a bearer header; other clients send ' +
        "'Authorization: Bearer <token>' or ?token= on GET",
    )
    .option('--poll-ms <ms>', 'how often the page refreshes live data', int({ min: 200 }), 2000)
    .action(
      async (o: {
        runs: string;
        evals: string;
        port: number;
        host: string;
        pollMs: number;
        token?: string;
      }) => {
        const { startDashboard } = await import('./server.js');
        const token = resolveToken(o.token);
        const d = await startDashboard({
          root: o.runs,
          more: [o.evals],
          port: o.port,
          host: o.host,
          pollMs: o.pollMs,
          ...(token ? { token } : {}),
        });
        const { existsSync } = await import('node:fs');
        const also = existsSync(o.evals) ? ` and ${o.evals}` : '';
        console.log(`rstar2 dashboard: ${d.url}  (serving ${o.runs}${also}; Ctrl-C to stop)`);
        const stop = () => void d.close().then(() => process.exit(0));
        process.once('SIGINT', stop);
        process.once('SIGTERM', stop);
      },
    );
}
