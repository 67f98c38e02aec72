import { readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createRequire } from 'node:module';
import { resolve } from 'node:path';
import {
  baseUrl,
  checkBind,
  httpGuard,
  type Refusal,
  requestTarget,
  sendRefusal,
} from '../util/http-guard.js';
import {
  type DirEntry,
  evalData,
  FILTERS,
  getTrajectory,
  listTrajectories,
  NotFound,
  problemOf,
  type RunStatus,
  runData,
  runStatus,
  scanDirs,
  type TrajFilter,
} from './data.js';

// A read-only local web server over run/eval directories: one HTML page (static/app.js, charts drawn
// with uPlot served from node_modules, so it works offline) and a small JSON API the page polls for live updates. Only directories found under
// --runs are reachable; names from the client are looked up, never joined into paths. Every request
// passes the shared guard (util/http-guard.ts: Host, Origin, optional token) first.

const STATIC = new URL('./static/', import.meta.url);
const JS = 'text/javascript; charset=utf-8';
const CSS = 'text/css; charset=utf-8';
// uPlot through the package resolver: a checkout, dist/ and an installed package each find their own
// node_modules (uplot is a dependency, installed next to rstar2).
const uplot = (file: string) => createRequire(import.meta.url).resolve(`uplot/dist/${file}`);
const FILES = new Map<string, [URL | string, string]>([
  ['/static/app.js', [new URL('app.js', STATIC), JS]],
  ['/static/style.css', [new URL('style.css', STATIC), CSS]],
  ['/static/uPlot.iife.min.js', [uplot('uPlot.iife.min.js'), JS]],
  ['/static/uPlot.min.css', [uplot('uPlot.min.css'), CSS]],
]);

function page(root: string, pollMs: number): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>rstar2 dashboard</title><link rel="stylesheet" href="/static/uPlot.min.css"><link rel="stylesheet" href="/static/style.css"></head>
<body data-poll-ms="${pollMs}">
<header><h1>rstar2 dashboard</h1><span class="root">${escapeHtml(root)}</span><span id="live" class="live">connecting…</span></header>
<div id="app">
<nav><h3>Training runs</h3><ul id="runs"></ul><h3>Evaluations <span title="tick to compare">(☑ compare)</span></h3><ul id="evals"></ul></nav>
<main>
<section class="card hidden" id="run-card"><h2 id="run-title"></h2><ul class="health hidden" id="run-health"></ul><div class="stats" id="run-stats"></div>
<div class="filters stages" id="stage-tabs"></div><div class="charts" id="charts"></div><h3>RoC statistics per step</h3><div id="roc"></div></section>
<section class="card hidden" id="eval-card"><h2 id="eval-title"></h2><div class="stats" id="eval-stats"></div><div id="eval-problems"></div></section>
<section class="card hidden" id="compare-card"><h2>Evaluations side by side</h2><div id="compare"></div></section>
<section class="card hidden" id="traj-card"><h2>Trajectories</h2>
<div class="toolbar"><select id="traj-file" aria-label="trajectory file"></select><div class="filters" id="filters"></div></div>
<div class="split"><ul id="traj-list"></ul><div id="traj-detail"></div></div></section>
</main></div>
<script src="/static/uPlot.iife.min.js"></script><script src="/static/app.js"></script></body></html>`;
}

function escapeHtml(s: string): string {
  return s.replace(
    /[&<>"]/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c] as string,
  );
}

export interface DashboardOptions {
  root: string;
  port?: number; // 0 = any free port
  host?: string; // default 127.0.0.1; anything but loopback needs `token`
  pollMs?: number;
  /** Required on every route but the static files, as a bearer header or `?token=` (the page passes
   * its own `?token=` on to the API). */
  token?: string;
  /** More directories to list, outside root: `rstar2 eval` writes to evals/ while runs go to runs/. */
  more?: string[];
}

export interface Dashboard {
  server: Server;
  url: string; // the page to open, with ?token= when there is one
  close(): Promise<void>;
}

function send(res: ServerResponse, status: number, type: string, body: string | Buffer): void {
  res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
  res.end(body);
}

function entries(root: string, more: string[]) {
  return scanDirs(root, more).map((e) => {
    let sub = '';
    let status: RunStatus | undefined;
    // one directory that cannot be read is listed as such, not a failed list
    try {
      if (e.kind === 'run') {
        const d = runData(e);
        const s = runStatus(e.dir);
        status = s?.status;
        sub = `${d.metrics.length} steps${s && s.status !== 'done' ? ` · ${s.note}` : ''}`;
      } else {
        const r = evalData(e).report as { avgAtK?: number; k?: number } | null;
        if (r?.avgAtK !== undefined) sub = `avg@${r.k} ${(100 * r.avgAtK).toFixed(1)}%`;
      }
    } catch (err) {
      sub = `unreadable: ${(err as Error).message}`;
    }
    return { kind: e.kind, name: e.name, sub, ...(status ? { status } : {}) };
  });
}

type Guard = (req: IncomingMessage, url: URL) => Refusal | null;

async function handle(
  root: string,
  more: string[],
  pollMs: number,
  guard: Guard,
  req: IncomingMessage,
  res: ServerResponse,
) {
  const url = requestTarget(req.url ?? '/');
  if (!url) return send(res, 400, 'text/plain; charset=utf-8', 'bad request target');
  const refusal = guard(req, url);
  if (refusal) return sendRefusal(res, refusal);
  const q = url.searchParams;
  const find = (): DirEntry => {
    const name = q.get('name');
    const kind = q.get('kind') ?? url.pathname.slice('/api/'.length);
    const e = scanDirs(root, more).find(
      (x) => x.name === name && (kind === x.kind || !['run', 'eval'].includes(kind)),
    );
    if (!e) throw new NotFound(`no ${kind} directory named '${name}' under ${root}`);
    return e;
  };
  const int = (k: string, dflt: number) => {
    const v = Number(q.get(k) ?? dflt);
    if (!Number.isInteger(v) || v < 0) throw new BadRequest(`${k} must be a non-negative integer`);
    return v;
  };
  const json = (x: unknown) => send(res, 200, 'application/json', JSON.stringify(x));
  try {
    if (req.method !== 'GET') return send(res, 405, 'text/plain', 'GET only');
    const file = FILES.get(url.pathname);
    if (file) return send(res, 200, file[1], readFileSync(file[0]));
    switch (url.pathname) {
      case '/':
      case '/index.html':
        return send(res, 200, 'text/html; charset=utf-8', page(root, pollMs));
      case '/favicon.ico':
        res.writeHead(204).end();
        return;
      case '/api/list':
        return json({ root, entries: entries(root, more) });
      case '/api/run':
        return json(runData(find()));
      case '/api/eval':
        return json(evalData(find()));
      case '/api/trajectories': {
        const filter = (q.get('filter') ?? 'all') as TrajFilter;
        if (!FILTERS.includes(filter)) throw new BadRequest(`filter must be one of ${FILTERS.join(', ')}`);
        return json(
          listTrajectories(find(), q.get('file') ?? '', filter, int('offset', 0), int('limit', 200)),
        );
      }
      case '/api/trajectory': {
        const e = find();
        const file = q.get('file') ?? '';
        const t = getTrajectory(e, file, q.get('id') ?? '');
        return json({ ...t, problem: await problemOf(e, file, t.promptId) });
      }
      default:
        return send(res, 404, 'text/plain', `not found: ${url.pathname}`);
    }
  } catch (e) {
    const status = e instanceof NotFound ? 404 : e instanceof BadRequest ? 400 : 500;
    send(res, status, 'text/plain', (e as Error).message);
  }
}

class BadRequest extends Error {}

export async function startDashboard(o: DashboardOptions): Promise<Dashboard> {
  const root = resolve(o.root);
  const host = o.host ?? '127.0.0.1';
  checkBind(host, o.token, 'dashboard');
  const more = o.more ?? [];
  scanDirs(root, more); // fail early on a bad --runs
  // The static files are the public app code, and the page's <script>/<link> cannot carry a token.
  const open = (p: string) => p.startsWith('/static/') || p === '/favicon.ico';
  const guard = httpGuard({ host, token: o.token, open, queryToken: true });
  const server = createServer(
    { requestTimeout: 30_000, headersTimeout: 10_000 },
    (req, res) => void handle(root, more, o.pollMs ?? 2000, guard, req, res),
  );
  await new Promise<void>((ok, fail) => {
    server.once('error', fail);
    server.listen(o.port ?? 8090, host, () => ok());
  });
  const addr = server.address();
  const port = typeof addr === 'object' && addr ? addr.port : (o.port ?? 8090);
  return {
    server,
    url: `${baseUrl(host, port)}/${o.token ? `?token=${encodeURIComponent(o.token)}` : ''}`,
    close: () =>
      new Promise<void>((ok) => {
        server.closeAllConnections();
        server.close(() => ok());
      }),
  };
}
