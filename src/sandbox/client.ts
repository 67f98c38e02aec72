import { randomBytes } from 'node:crypto';
import { type HttpAnswer, postJson } from '../util/http.js';
import { authHeaders, resolveToken } from '../util/http-guard.js';
import { sleep } from '../util/sleep.js';
import { failedResult } from './codejudge.js';
import type { CodeRunner, RunRequest, RunResult } from './types.js';

// CodeRunner over the service's native API. Connection failures and 503 "busy" answers are retried
// with back-off; when retries run out every item still gets a result (status internal_error/busy
// with the cause), so a caller never loses a tool call to a network fault.

export interface SandboxClientOptions {
  url: string; // e.g. http://127.0.0.1:8088
  /** Attempts per batch after the first (connection errors and busy answers). */
  retries?: number;
  backoffMs?: number;
  /** Identifies this client to the server's fair queue. */
  clientId?: string;
  /** Items per HTTP request; larger batches are split and sent concurrently. */
  maxBatch?: number;
  /** Per-request HTTP timeout; default none (the server answers every item). */
  requestTimeoutMs?: number;
  /** The service's bearer token; default $RSTAR2_TOKEN. */
  token?: string;
  /** Secret that makes this client's sessions its own; default a random one per client. Share it
   * only between clients that should see each other's sessions. */
  sessionKey?: string;
}

export class SandboxClient implements CodeRunner {
  private readonly o: Required<Omit<SandboxClientOptions, 'clientId' | 'requestTimeoutMs' | 'token'>> &
    SandboxClientOptions;
  private readonly headers: Record<string, string>;

  constructor(opts: SandboxClientOptions) {
    // a mistyped --sandbox would otherwise fail every tool call, and a run would go on scoring them as errors
    const protocol = URL.canParse(opts.url) ? new URL(opts.url).protocol : '';
    if (protocol !== 'http:' && protocol !== 'https:')
      throw new Error(`invalid sandbox service URL '${opts.url}' (expected e.g. http://127.0.0.1:8088)`);
    this.o = {
      retries: 5,
      backoffMs: 200,
      maxBatch: 256,
      sessionKey: randomBytes(16).toString('hex'),
      ...opts,
      url: opts.url.replace(/\/+$/, ''),
    };
    this.headers = {
      ...authHeaders(opts.token ?? resolveToken()),
      'x-rstar2-session-key': this.o.sessionKey,
      ...(this.o.clientId ? { 'x-rstar2-client': this.o.clientId } : {}),
    };
  }

  async run(req: RunRequest): Promise<RunResult> {
    return (await this.runBatch([req]))[0];
  }

  async runBatch(reqs: RunRequest[]): Promise<RunResult[]> {
    if (reqs.length === 0) return [];
    const chunks: RunRequest[][] = [];
    for (let i = 0; i < reqs.length; i += this.o.maxBatch) chunks.push(reqs.slice(i, i + this.o.maxBatch));
    return (await Promise.all(chunks.map((c) => this.sendChunk(c)))).flat();
  }

  private async sendChunk(reqs: RunRequest[]): Promise<RunResult[]> {
    let lastError = '';
    let lastStatus: 'internal_error' | 'busy' = 'internal_error';
    for (let attempt = 0; attempt <= this.o.retries; attempt++) {
      if (attempt > 0) await sleep(this.o.backoffMs * 2 ** (attempt - 1));
      let res: HttpAnswer;
      try {
        res = await postJson(`${this.o.url}/v1/batch`, JSON.stringify({ requests: reqs }), {
          headers: this.headers,
          signal: this.o.requestTimeoutMs ? AbortSignal.timeout(this.o.requestTimeoutMs) : undefined,
        });
      } catch (e) {
        const err = e as Error & { code?: string };
        lastError = `cannot reach sandbox service at ${this.o.url}: ${err.code ?? err.message}`;
        lastStatus = 'internal_error';
        continue;
      }
      const text = res.text;
      if (res.status === 503 || res.status === 429) {
        lastError = `sandbox service busy: ${text}`;
        lastStatus = 'busy';
        continue;
      }
      if (res.status >= 500) {
        lastError = `sandbox service error ${res.status}: ${text}`;
        lastStatus = 'internal_error';
        continue;
      }
      if (res.status !== 200) {
        // A 4xx will not improve on retry: the request itself is wrong.
        return reqs.map(() =>
          failedResult('invalid_input', `sandbox service refused the batch (${res.status}): ${text}`),
        );
      }
      try {
        const body = JSON.parse(text) as { results?: RunResult[] };
        if (!Array.isArray(body.results) || body.results.length !== reqs.length)
          throw new Error(`expected ${reqs.length} results`);
        return body.results;
      } catch (e) {
        lastError = `bad answer from sandbox service: ${(e as Error).message}`;
        lastStatus = 'internal_error';
      }
    }
    return reqs.map(() => failedResult(lastStatus, `${lastError} (after ${this.o.retries + 1} attempts)`));
  }

  async closeSession(session: string): Promise<boolean> {
    const res = await postJson(`${this.o.url}/v1/session/close`, JSON.stringify({ session }), {
      headers: this.headers,
    });
    const text = res.text;
    if (res.status !== 200)
      throw new Error(`sandbox service could not close session ${session} (${res.status}): ${text}`);
    return (JSON.parse(text) as { closed: boolean }).closed;
  }

  async close(): Promise<void> {}
}
