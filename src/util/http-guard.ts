import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';

// The request checks shared by the sandbox service and the dashboard. Both are local tools that run
// code or show private runs, so a web page the user happens to open must not reach them: a foreign
// Origin is refused (cross-site POSTs), a foreign Host is refused on loopback binds (DNS rebinding),
// and an optional bearer token is required. Binding beyond loopback is refused without a token.

export const TOKEN_ENV = 'RSTAR2_TOKEN';
const LOOPBACK_NAMES = new Set(['localhost', '127.0.0.1', '[::1]']);

/** Whether a bind address (or Host name) only accepts connections from this machine. */
export function isLoopback(host: string): boolean {
  const h = host.toLowerCase();
  return LOOPBACK_NAMES.has(h) || h === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h);
}

/** The --token flag, else $RSTAR2_TOKEN; an empty value means no token. */
export function resolveToken(flag?: string): string | undefined {
  const t = flag ?? process.env[TOKEN_ENV];
  return t ? t : undefined;
}

/** Throws with the reason when serving `host` with `token` would be unsafe. */
export function checkBind(host: string, token: string | undefined, what: string): void {
  if (token !== undefined && token.length < 16)
    throw new Error(`the ${what} token must be at least 16 characters (it guards code execution)`);
  if (!isLoopback(host) && token === undefined)
    throw new Error(
      `refusing to serve the ${what} on --host ${host}: it is not a loopback address, so anyone who can ` +
        `reach it could use it. Set a token (--token or ${TOKEN_ENV}) to serve beyond this machine, or keep 127.0.0.1.`,
    );
}

/** `http://host:port` with IPv6 addresses bracketed. */
export function baseUrl(host: string, port: number): string {
  return `http://${host.includes(':') && !host.startsWith('[') ? `[${host}]` : host}:${port}`;
}

export interface GuardOptions {
  /** The bind address; accepted as a Host name besides the loopback names. */
  host: string;
  token?: string;
  /** Paths served without the token (Host and Origin are still checked). */
  open?: (path: string) => boolean;
  /** Also accept the token as `?token=` on GET, for a browser opening a printed URL. */
  queryToken?: boolean;
}

export interface Refusal {
  status: number;
  error: string;
  message: string;
}

const digest = (s: string) => createHash('sha256').update(s).digest();

/** Builds the check a server runs first on every request: null to go on, else why it is refused. */
export function httpGuard(o: GuardOptions): (req: IncomingMessage, url: URL) => Refusal | null {
  const want = o.token === undefined ? undefined : digest(o.token);
  const hostNames = new Set([...LOOPBACK_NAMES, bracket(o.host.toLowerCase())]);
  return (req, url) => {
    const host = req.headers.host;
    // Only on loopback binds: beyond them the token is required, and remote clients reach the server
    // by names it cannot know. A rebinding page never has the token.
    if (isLoopback(o.host) && host !== undefined && !hostNames.has(hostName(host)))
      return {
        status: 421,
        error: 'bad_host',
        message: `Host '${host}' is not this server (it answers to localhost, 127.0.0.1, [::1] or ${o.host}); refused to stop DNS rebinding`,
      };
    const origin = req.headers.origin;
    // https too: the same Host behind a TLS proxy is still this server.
    if (origin !== undefined && origin !== `http://${host}` && origin !== `https://${host}`)
      return {
        status: 403,
        error: 'bad_origin',
        message: `Origin '${origin}' is not this server's (http://${host}); requests from other web pages are refused`,
      };
    if (want === undefined || o.open?.(url.pathname)) return null;
    const auth = req.headers.authorization;
    let given = auth?.startsWith('Bearer ') ? auth.slice('Bearer '.length) : basicPassword(auth);
    if (given === undefined && o.queryToken && req.method === 'GET')
      given = url.searchParams.get('token') ?? undefined;
    if (given === undefined)
      return {
        status: 401,
        error: 'unauthorized',
        message: `this server needs its token: send 'Authorization: Bearer <token>', or put it in the URL as http://:<token>@host:port (the --token or ${TOKEN_ENV} it was started with)`,
      };
    if (!timingSafeEqual(digest(given), want))
      return { status: 401, error: 'unauthorized', message: 'wrong token' };
    return null;
  };
}

/** The password of HTTP Basic credentials: clients that take only a URL (code-judge's and verl's Python clients,
 * through requests/aiohttp) send `http://:TOKEN@host:port` that way. */
function basicPassword(auth: string | undefined): string | undefined {
  if (!auth?.startsWith('Basic ')) return undefined;
  const pair = Buffer.from(auth.slice('Basic '.length), 'base64').toString('utf8');
  const colon = pair.indexOf(':');
  return colon >= 0 ? pair.slice(colon + 1) : undefined;
}

function bracket(h: string): string {
  return h.includes(':') && !h.startsWith('[') ? `[${h}]` : h;
}

/** The name part of a Host header, lower-cased: `[::1]:80` → `[::1]`, `a.b:80` → `a.b`. */
function hostName(host: string): string {
  const h = host.toLowerCase();
  if (h.startsWith('[')) return h.slice(0, h.indexOf(']') + 1);
  const colon = h.lastIndexOf(':');
  return colon >= 0 ? h.slice(0, colon) : h;
}

export function sendRefusal(res: ServerResponse, r: Refusal): void {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (r.status === 401) headers['www-authenticate'] = 'Bearer';
  res.writeHead(r.status, headers);
  res.end(JSON.stringify({ error: r.error, message: r.message }));
}

/** Request headers a client adds for `token`. */
export function authHeaders(token: string | undefined): Record<string, string> {
  return token ? { authorization: `Bearer ${token}` } : {};
}

/** The request target as a URL, or null when it is not one. Origin-form targets are appended to a
 * fixed origin rather than resolved against it: `//host/x` and `/\\` would otherwise be read as an
 * authority (a 500 for `/\\`, and a pathname other than the one routed on for `//host/ping`). */
export function requestTarget(raw: string): URL | null {
  try {
    return raw.startsWith('/') ? new URL(`http://x${raw}`) : new URL(raw);
  } catch {
    return null;
  }
}
