import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { findPython, PYTHON_DIR } from '../../src/util/python.js';

// Small fake servers that speak each backend's API (shapes from the rollout notes). `mode` lets a
// test inject: slow responses, 5xx, dropped connections and server-side aborts.

export type Mode = 'ok' | 'slow' | '503' | 'drop' | 'abort' | '400';
export type Api = 'sglang' | 'vllm' | 'llamacpp';

export interface Fake {
  url: string;
  modes: Mode[]; // consumed one per generate request; 'ok' when empty
  requests: { path: string; body: Record<string, unknown> }[];
  /** What the load endpoints report: SGLang /v1/loads (one DP rank) and vLLM /metrics. */
  load: { used: number; running: number; waiting: number };
  dead: boolean; // drop every connection, load endpoints included
  cached?: number; // cached prompt tokens to report (SGLang meta_info.cached_tokens, vLLM usage.prompt_tokens_details)
  /** Weight-update group: a python rank (python/tests/fake_engine_rank.py) joins and receives; each update lands in a file. */
  received: string[]; // safetensors files, one per update, in order
  failInit?: boolean; // answer init_weights_update_group with success: false (without joining)
  close(): Promise<void>;
}

// One engine rank in a real process group (gloo), started on the first init request.
class GroupRank {
  private readonly child: ChildProcess;
  private readonly replies: ((line: string) => void)[] = [];

  constructor() {
    this.child = spawn(findPython(), [join(PYTHON_DIR, 'tests', 'fake_engine_rank.py')], {
      env: { ...process.env, PYTHONPATH: PYTHON_DIR },
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    createInterface({ input: this.child.stdout! }).on('line', (l) => this.replies.shift()?.(l));
  }

  ask(req: Record<string, unknown>): Promise<Record<string, unknown>> {
    return new Promise((res) => {
      this.replies.push((l) => res(JSON.parse(l)));
      this.child.stdin?.write(`${JSON.stringify(req)}\n`);
    });
  }

  close(): void {
    this.child.kill('SIGKILL');
  }
}

export const OUT = [11, 12, 13];
export const LPS = [-0.1, -0.2, -0.3];

function generateBody(api: Api, mode: Mode, cached?: number): unknown {
  const ids = mode === 'abort' ? OUT.slice(0, 1) : OUT;
  const lps = mode === 'abort' ? LPS.slice(0, 1) : LPS;
  if (api === 'sglang') {
    return {
      text: 'abc',
      output_ids: ids,
      meta_info: {
        ...(cached === undefined ? {} : { cached_tokens: cached }),
        output_token_logprobs: ids.map((id, i) => [lps[i], id, null]),
        finish_reason:
          mode === 'abort'
            ? { type: 'abort', message: 'Abort in waiting queue' }
            : { type: 'stop', matched: 13 },
      },
    };
  }
  if (api === 'vllm') {
    return {
      choices: [
        {
          text: 'abc',
          token_ids: ids,
          finish_reason: mode === 'abort' ? 'abort' : 'stop',
          logprobs: { tokens: ids.map((i) => `token_id:${i}`), token_logprobs: lps },
        },
      ],
      ...(cached === undefined ? {} : { usage: { prompt_tokens_details: { cached_tokens: cached } } }),
    };
  }
  return {
    content: 'abc',
    tokens: ids,
    stop: true,
    stop_type: mode === 'abort' ? 'none' : 'eos',
    completion_probabilities: ids.map((id, i) => ({ id, token: 'x', logprob: lps[i], bytes: [] })),
  };
}

export const GEN_PATH: Record<Api, string> = {
  sglang: '/generate',
  vllm: '/v1/completions',
  llamacpp: '/completion',
};

export async function fakeServer(api: Api): Promise<Fake> {
  const f: Partial<Fake> & Pick<Fake, 'modes' | 'requests' | 'load' | 'dead' | 'received'> = {
    modes: [],
    requests: [],
    load: { used: 1500, running: 3, waiting: 1 },
    dead: false,
    received: [],
  };
  let rank: GroupRank | undefined;
  let outDir: string | undefined;
  // SGLang's /init_weights_update_group and /update_weights_from_distributed bodies (vLLM: the same fields
  // as the extension's one JSON argument), answered as SGLang does: {success, message}
  const group = async (op: 'init' | 'update', body: Record<string, unknown>) => {
    if (op === 'init' && f.failInit) return { success: false, message: 'init failed (test)' };
    rank ??= new GroupRank();
    if (op === 'init') return rank.ask({ op, ...body });
    outDir ??= mkdtempSync(join(tmpdir(), 'rstar2-fake-engine-'));
    const out = join(outDir, `update-${f.received.length + 1}.safetensors`);
    const r = await rank.ask({ op, ...body, out });
    if (r.success) f.received.push(out);
    return r;
  };
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    let raw = '';
    req.on('data', (c) => (raw += c));
    req.on('end', () => {
      if (f.dead) return req.socket.destroy();
      const body = raw ? (JSON.parse(raw) as Record<string, unknown>) : {};
      const path = req.url ?? '';
      f.requests.push({ path, body });
      const json = (code: number, o: unknown) => {
        res.writeHead(code, { 'content-type': 'application/json' });
        res.end(JSON.stringify(o));
      };
      if (path === GEN_PATH[api]) {
        const mode = f.modes.shift() ?? 'ok';
        if (mode === 'drop') return req.socket.destroy();
        if (mode === '503') return json(503, { error: 'overloaded' });
        if (mode === '400') return json(400, { error: 'bad request: input too long' });
        if (mode === 'slow') return void setTimeout(() => json(200, generateBody(api, 'ok')), 400);
        return json(200, generateBody(api, mode, f.cached));
      }
      if (api === 'sglang' && path === '/get_server_info') {
        return json(200, {
          model_path: 'x',
          max_total_num_tokens: 123456,
          tp_size: 1,
          dp_size: 1,
          internal_states: [{ load: 0 }],
        });
      }
      if (api === 'sglang' && path.startsWith('/v1/loads')) {
        // two DP ranks splitting the load 2:1
        const part = (k: number, d: number) => Math.round((k * d) / 3);
        const { used, running, waiting } = f.load;
        return json(200, {
          loads: [
            {
              dp_rank: 0,
              num_running_reqs: part(running, 2),
              num_waiting_reqs: waiting,
              num_used_tokens: part(used, 2),
            },
            {
              dp_rank: 1,
              num_running_reqs: running - part(running, 2),
              num_waiting_reqs: 0,
              num_used_tokens: used - part(used, 2),
            },
          ],
        });
      }
      if (api === 'sglang' && path === '/update_weights_from_disk')
        return json(200, { success: true, message: 'ok' });
      if (api === 'vllm' && path === '/v1/models') return json(200, { data: [{ id: 'tiny-model' }] });
      if (api === 'vllm' && path === '/metrics') {
        res.writeHead(200, { 'content-type': 'text/plain' });
        return res.end(
          [
            '# HELP vllm:cache_config_info info',
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0',
            `vllm:kv_cache_usage_perc{engine="0",model_name="tiny-model"} ${f.load.used / 16_000}`,
            `vllm:num_requests_running{engine="0",model_name="tiny-model"} ${f.load.running}.0`,
            `vllm:num_requests_waiting{engine="0",model_name="tiny-model"} ${f.load.waiting}.0`,
          ].join('\n'),
        );
      }
      if (api === 'sglang' && path === '/init_weights_update_group')
        return void group('init', body).then((r) => json(200, r));
      if (api === 'sglang' && path === '/update_weights_from_distributed')
        return void group('update', body).then((r) => json(200, r));
      if (api === 'vllm' && path === '/collective_rpc') {
        const arg = () => JSON.parse((body.args as string[])[0]) as Record<string, unknown>;
        // a worker method that raises comes back from vLLM as HTTP 500
        const rpc = (op: 'init' | 'update') =>
          void group(op, arg()).then((r) => (r.success ? json(200, { results: [r] }) : json(500, r)));
        if (body.method === 'rstar2_weight_sync_ranks') return json(200, { results: [{ rank: 0 }] });
        if (body.method === 'init_weight_update_group') return rpc('init');
        if (body.method === 'update_weights_from_distributed') return rpc('update');
        return json(200, {});
      }
      if (api === 'vllm' && path === '/reset_prefix_cache') {
        res.writeHead(200);
        return res.end();
      }
      if (api === 'llamacpp' && path === '/slots') {
        return json(200, [
          { id: 0, n_ctx: 4096, is_processing: true },
          { id: 1, n_ctx: 4096, is_processing: false },
        ]);
      }
      json(404, { error: `no route ${path}` });
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  f.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  f.close = () =>
    new Promise<void>((r) => {
      rank?.close();
      server.closeAllConnections();
      server.close(() => r());
    });
  return f as Fake;
}
