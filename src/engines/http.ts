import { sleep } from '../util/sleep.js';
import type { GenerateResult } from './types.js';

// Shared HTTP plumbing for remote engines: JSON POST/GET with a per-attempt timeout, retries on
// connection loss / 5xx / 429 / timeout, and caller cancellation. Every failure ends as a thrown
// HttpError with the cause in its message, so an engine can turn it into a GenerateResult that the
// agent loop records instead of losing the trajectory.

export interface HttpOptions {
  timeoutMs?: number; // per attempt; default 600 s (long generations are normal)
  retries?: number; // extra attempts after the first; default 3
  backoffMs?: number; // first retry delay, doubled each time; default 200
  headers?: Record<string, string>;
}

export class HttpError extends Error {
  constructor(
    message: string,
    readonly status?: number,
    readonly aborted = false,
  ) {
    super(message);
  }
}

const RETRY_STATUS = new Set([408, 429, 500, 502, 503, 504]);

export class HttpClient {
  readonly base: string;
  private readonly timeoutMs: number;
  private readonly retries: number;
  private readonly backoffMs: number;

  constructor(
    base: string,
    private readonly opts: HttpOptions = {},
  ) {
    let u: URL;
    try {
      u = new URL(base);
    } catch {
      throw new Error(`invalid engine URL '${base}' (expected e.g. http://127.0.0.1:30000)`);
    }
    if (u.protocol !== 'http:' && u.protocol !== 'https:') {
      throw new Error(`invalid engine URL '${base}': protocol must be http or https`);
    }
    this.base = base.replace(/\/+$/, '');
    this.timeoutMs = opts.timeoutMs ?? 600_000;
    this.retries = opts.retries ?? 3;
    this.backoffMs = opts.backoffMs ?? 200;
  }

  async json<T>(method: 'GET' | 'POST', path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
    const text = await this.request(method, path, body, signal);
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new HttpError(`${method} ${path}: response is not JSON: ${text.slice(0, 200)}`);
    }
  }

  async text(path: string, signal?: AbortSignal): Promise<string> {
    return this.request('GET', path, undefined, signal);
  }

  /** A POST whose answer may be empty (vLLM's dev routes answer a bare 200). */
  async post(path: string, body: unknown): Promise<string> {
    return this.request('POST', path, body);
  }

  private async request(method: string, path: string, body: unknown, signal?: AbortSignal): Promise<string> {
    let lastErr = '';
    for (let attempt = 0; attempt <= this.retries; attempt++) {
      if (signal?.aborted) throw new HttpError(`${method} ${path}: aborted by caller`, undefined, true);
      if (attempt > 0) await sleep(this.backoffMs * 2 ** (attempt - 1), signal);
      const timeout = AbortSignal.timeout(this.timeoutMs);
      const sig = signal ? AbortSignal.any([signal, timeout]) : timeout;
      try {
        const res = await fetch(this.base + path, {
          method,
          headers: { 'content-type': 'application/json', ...this.opts.headers },
          body: body === undefined ? undefined : JSON.stringify(body),
          signal: sig,
        });
        const text = await res.text();
        if (res.ok) return text;
        lastErr = `HTTP ${res.status}: ${text.slice(0, 300)}`;
        if (!RETRY_STATUS.has(res.status)) throw new HttpError(`${method} ${path}: ${lastErr}`, res.status);
      } catch (e) {
        if (e instanceof HttpError) throw e;
        if (signal?.aborted) throw new HttpError(`${method} ${path}: aborted by caller`, undefined, true);
        const err = e as Error & { cause?: { code?: string; message?: string } };
        lastErr = timeout.aborted
          ? `timed out after ${this.timeoutMs} ms`
          : `${err.message}${err.cause ? ` (${err.cause.code ?? err.cause.message})` : ''}`;
      }
    }
    throw new HttpError(`${method} ${path} failed after ${this.retries + 1} attempts: ${lastErr}`);
  }
}

/** Turns a thrown error into the GenerateResult shape: caller aborts are 'abort', the rest 'error'. */
export function failure(e: unknown): {
  outputIds: number[];
  logprobs: number[];
  finishReason: 'abort' | 'error';
  error: string;
} {
  const aborted = e instanceof HttpError && e.aborted;
  return {
    outputIds: [],
    logprobs: [],
    finishReason: aborted ? 'abort' : 'error',
    error: (e as Error).message,
  };
}

/** What a served model's context holds: a request of P prompt tokens may ask for `tokens − spare − P` new ones,
 *  none once P reaches `maxInput` (where the server takes shorter prompts than its context). */
export interface ContextLimit {
  tokens: number;
  spare: number;
  maxInput?: number;
}

/** The answer to a request with no room left in the model's context, which is then not sent: the trajectory is
 *  out of context, which ends it at its length (finish 'length'), not as an engine failure. */
export function outOfContext(): GenerateResult {
  return { outputIds: [], logprobs: [], finishReason: 'length' };
}

/**
 * Caps each request's new tokens to the model's context, as verl's rollout does: a multi-turn prompt grows every
 * turn, and a server answers prompt + max new tokens past its context with HTTP 400, which would end the trajectory
 * as an engine failure instead of at its length. The limit is read once; a server that publishes none (an older
 * build) gets requests as they were, which is logged once. A read that fails is tried again on the next request.
 */
export class ContextCap {
  private cached?: Promise<ContextLimit | undefined>;

  constructor(
    private readonly name: string,
    private readonly read: () => Promise<ContextLimit | undefined>,
    private readonly log: (line: string) => void = (l) => console.error(l),
  ) {}

  /** The server's limit, undefined where it publishes none. */
  limit(): Promise<ContextLimit | undefined> {
    // not the caller's signal: concurrent requests share this read, and one caller's abort must not fail the rest
    this.cached ??= this.read().then(
      (l) => {
        if (!l)
          this.log(`${this.name}: the server publishes no context length; new tokens are not capped to it`);
        return l;
      },
      (e) => {
        this.cached = undefined;
        throw e;
      },
    );
    return this.cached;
  }

  /** New tokens a request of `promptTokens` may ask for: at most `maxNew`, 0 when the context has no room. The
   *  caller's abort ends the wait for the shared read at once (an 'abort', as for a request in flight). */
  async fit(promptTokens: number, maxNew: number, signal?: AbortSignal): Promise<number> {
    let off = () => {};
    const aborted = new Promise<never>((_, reject) => {
      const on = () => reject(new HttpError('context length read: aborted by caller', undefined, true));
      if (signal?.aborted) on();
      signal?.addEventListener('abort', on, { once: true });
      off = () => signal?.removeEventListener('abort', on);
    });
    try {
      return room(await Promise.race([this.limit(), aborted]), promptTokens, maxNew);
    } finally {
      off();
    }
  }
}

/** New tokens a prompt of `promptTokens` may ask for under `l` (none published: all of `maxNew`). */
export function room(l: ContextLimit | undefined, promptTokens: number, maxNew: number): number {
  if (!l) return maxNew;
  if (l.maxInput !== undefined && promptTokens >= l.maxInput) return 0;
  return Math.max(0, Math.min(maxNew, l.tokens - l.spare - promptTokens));
}

/** A GET whose route older servers lack: undefined on 404. Bounded by `CONTEXT_READ_MS`, not by the client's
 *  long per-request timeout (made for long generations): every generate waits for this read. */
export const CONTEXT_READ_MS = 30_000;
export async function getIfServed<T>(http: HttpClient, path: string): Promise<T | undefined> {
  try {
    return await http.json<T>('GET', path, undefined, AbortSignal.timeout(CONTEXT_READ_MS));
  } catch (e) {
    if (e instanceof HttpError && e.status === 404) return undefined;
    // the timeout aborts it as a caller would; it is the server's failure, not an abort
    if (e instanceof HttpError && e.aborted)
      throw new HttpError(`GET ${path}: no answer in ${CONTEXT_READ_MS} ms`);
    throw e;
  }
}

/** Prometheus text: every sample of `name` (one per label set, e.g. per vLLM engine core), in order. */
export function promValues(text: string, name: string): { value: number; labels: Record<string, string> }[] {
  const out: { value: number; labels: Record<string, string> }[] = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (rest[0] !== '{' && rest[0] !== ' ') continue;
    const labels: Record<string, string> = {};
    let valuePart = rest;
    if (rest[0] === '{') {
      const close = rest.indexOf('}');
      for (const m of rest.slice(1, close).matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[m[1]] = m[2];
      valuePart = rest.slice(close + 1);
    }
    const value = Number(valuePart.trim().split(/\s+/)[0]);
    if (Number.isFinite(value)) out.push({ value, labels });
  }
  return out;
}
