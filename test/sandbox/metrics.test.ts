// /metrics must stay a valid Prometheus text exposition whatever clients send: hostile paths
// (quotes, backslashes, encoded newlines) and floods of distinct paths must neither break the scrape
// nor grow a series per path. The whole output is parsed by a strict parser of the text format
// (0.0.4) written here: prom-client only writes the format, it ships no parser.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { Agent, type IncomingMessage, request } from 'node:http';
import { after, test } from 'node:test';
import { SandboxServer, type SandboxServerOptions } from '../../src/sandbox/server.js';
import { FakeRunner, okResult } from './helpers.js';

const servers: SandboxServer[] = [];
const agent = new Agent({ keepAlive: true, maxSockets: 8 });
after(async () => {
  agent.destroy();
  for (const s of servers) await s.close();
});

async function start(opts: Partial<SandboxServerOptions> = {}) {
  const s = new SandboxServer({
    runner: new FakeRunner(),
    port: 0,
    log: () => {},
    logRequests: false,
    ...opts,
  });
  servers.push(s);
  const { port } = await s.listen();
  return { s, port };
}

/** One request with the path exactly as given (fetch would percent-encode quotes and backslashes). */
function send(
  port: number,
  method: string,
  path: string,
  body?: string,
): Promise<{ status: number; text: string; type: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, method, path, agent }, async (res: IncomingMessage) => {
      let text = '';
      for await (const c of res) text += c;
      resolve({ status: res.statusCode ?? 0, text, type: String(res.headers['content-type']) });
    });
    req.on('error', reject);
    req.end(body);
  });
}

// ---------------------------------------------------------------------------------------------------
// A strict parser of the Prometheus text format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format).

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}
interface Family {
  name: string;
  type: string;
  help?: string;
  samples: Sample[];
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*/;
// Values are read by Go's strconv.ParseFloat in Prometheus (expfmt and the scrape parser), which
// takes NaN and Inf/Infinity in any case: prom-client writes NaN as `Nan`.
const FLOAT = /^(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:inf|infinity)|nan)$/i;
const TYPES = new Set(['counter', 'gauge', 'histogram', 'summary', 'untyped']);

/** The family a sample name belongs to, given the declared types. */
function familyOf(name: string, types: Map<string, string>): string {
  for (const suffix of ['_bucket', '_sum', '_count']) {
    if (!name.endsWith(suffix)) continue;
    const base = name.slice(0, -suffix.length);
    const t = types.get(base);
    if (t === 'histogram' || (t === 'summary' && suffix !== '_bucket')) return base;
  }
  return name;
}

function unescapeHelp(s: string, line: number): string {
  return s.replace(/\\(.?)/g, (_m, c: string) => {
    if (c === '\\') return '\\';
    if (c === 'n') return '\n';
    throw new Error(`line ${line}: invalid escape \\${c} in HELP`);
  });
}

export function parsePrometheusText(text: string): Map<string, Family> {
  if (text.length > 0 && !text.endsWith('\n')) throw new Error('exposition must end with a newline');
  const families = new Map<string, Family>();
  const types = new Map<string, string>();
  const seenSeries = new Set<string>();
  const closed = new Set<string>(); // families whose samples ended (a family must be contiguous)
  let current: string | undefined;
  const lines = text.split('\n');
  lines.pop();
  const family = (name: string): Family => {
    let f = families.get(name);
    if (!f) {
      f = { name, type: 'untyped', samples: [] };
      families.set(name, f);
    }
    return f;
  };
  lines.forEach((l, i) => {
    const ln = i + 1;
    if (/^[ \t]*$/.test(l)) return;
    if (l.includes('\r')) throw new Error(`line ${ln}: carriage return`);
    if (/^[ \t]*#/.test(l)) {
      const m = /^[ \t]*#[ \t]+(HELP|TYPE)[ \t]+([^ \t]+)(?:[ \t]+(.*))?$/.exec(l);
      if (!m) return; // an ordinary comment
      const [, kw, name, rest = ''] = m;
      if (!/^[a-zA-Z_:][a-zA-Z0-9_:]*$/.test(name)) throw new Error(`line ${ln}: bad metric name ${name}`);
      const f = family(name);
      if (closed.has(name) || (f.samples.length > 0 && kw === 'TYPE'))
        throw new Error(`line ${ln}: ${kw} for ${name} after its samples`);
      if (kw === 'HELP') {
        if (f.help !== undefined) throw new Error(`line ${ln}: second HELP for ${name}`);
        f.help = unescapeHelp(rest, ln);
      } else {
        if (types.has(name)) throw new Error(`line ${ln}: second TYPE for ${name}`);
        if (!TYPES.has(rest.trim())) throw new Error(`line ${ln}: unknown type ${rest}`);
        types.set(name, rest.trim());
        f.type = rest.trim();
      }
      return;
    }
    // sample: name [{labels}] value [timestamp]
    let rest = l.replace(/^[ \t]+/, '');
    const nm = METRIC_NAME.exec(rest);
    if (!nm) throw new Error(`line ${ln}: no metric name: ${JSON.stringify(l)}`);
    const name = nm[0];
    rest = rest.slice(name.length);
    const labels: Record<string, string> = {};
    if (rest.startsWith('{')) {
      rest = rest.slice(1);
      for (;;) {
        rest = rest.replace(/^[ \t]*/, '');
        if (rest.startsWith('}')) break;
        const lm = LABEL_NAME.exec(rest);
        if (!lm) throw new Error(`line ${ln}: bad label name in ${JSON.stringify(l)}`);
        const lname = lm[0];
        if (lname in labels) throw new Error(`line ${ln}: duplicate label ${lname}`);
        rest = rest.slice(lname.length).replace(/^[ \t]*/, '');
        if (!rest.startsWith('="')) throw new Error(`line ${ln}: expected =" after ${lname}`);
        rest = rest.slice(2);
        let value = '';
        for (;;) {
          if (rest.length === 0) throw new Error(`line ${ln}: unterminated label value`);
          const c = rest[0];
          if (c === '"') {
            rest = rest.slice(1);
            break;
          }
          if (c === '\\') {
            const e = rest[1];
            if (e === '\\') value += '\\';
            else if (e === '"') value += '"';
            else if (e === 'n') value += '\n';
            else throw new Error(`line ${ln}: invalid escape \\${e ?? ''} in label value`);
            rest = rest.slice(2);
          } else {
            value += c;
            rest = rest.slice(1);
          }
        }
        labels[lname] = value;
        rest = rest.replace(/^[ \t]*/, '');
        if (rest.startsWith(',')) rest = rest.slice(1);
        else if (!rest.startsWith('}'))
          throw new Error(`line ${ln}: expected , or } in ${JSON.stringify(l)}`);
      }
      rest = rest.slice(1);
    }
    if (!/^[ \t]+[^ \t]/.test(rest)) throw new Error(`line ${ln}: no value: ${JSON.stringify(l)}`);
    const tokens = rest.trim().split(/[ \t]+/);
    if (tokens.length > 2) throw new Error(`line ${ln}: expected value [timestamp]: ${JSON.stringify(l)}`);
    if (!FLOAT.test(tokens[0])) throw new Error(`line ${ln}: bad value ${tokens[0]}`);
    if (tokens[1] !== undefined && !/^-?\d+$/.test(tokens[1]))
      throw new Error(`line ${ln}: bad timestamp ${tokens[1]}`);
    const v = tokens[0].toLowerCase();
    const value = /inf/.test(v)
      ? v.startsWith('-')
        ? -Infinity
        : Infinity
      : v === 'nan'
        ? Number.NaN
        : Number(v);
    const fname = familyOf(name, types);
    if (current !== fname) {
      if (current !== undefined) closed.add(current);
      if (closed.has(fname)) throw new Error(`line ${ln}: samples of ${fname} are not contiguous`);
      current = fname;
    }
    const key = `${name}${JSON.stringify(Object.entries(labels).sort())}`;
    if (seenSeries.has(key)) throw new Error(`line ${ln}: duplicate series ${key}`);
    seenSeries.add(key);
    const f = family(fname);
    if (f.type === 'histogram' && name === `${fname}_bucket` && labels.le === undefined)
      throw new Error(`line ${ln}: histogram bucket without le`);
    if (f.type === 'histogram' && name === fname)
      throw new Error(`line ${ln}: bare sample of histogram ${fname}`);
    if (f.type === 'counter' && !(value >= 0)) throw new Error(`line ${ln}: counter ${name} is ${value}`);
    f.samples.push({ name, labels, value });
  });
  for (const f of families.values()) if (f.type === 'histogram') checkHistogram(f);
  return families;
}

function checkHistogram(f: Family): void {
  const groups = new Map<string, Sample[]>();
  for (const s of f.samples) {
    const { le: _le, ...rest } = s.labels;
    const k = JSON.stringify(Object.entries(rest).sort());
    groups.set(k, [...(groups.get(k) ?? []), s]);
  }
  for (const ss of groups.values()) {
    const buckets = ss.filter((s) => s.name === `${f.name}_bucket`);
    const count = ss.find((s) => s.name === `${f.name}_count`);
    const sum = ss.find((s) => s.name === `${f.name}_sum`);
    assert.ok(count && sum, `${f.name}: _count and _sum present`);
    const les = buckets.map((b) => (b.labels.le === '+Inf' ? Infinity : Number(b.labels.le)));
    assert.ok(
      les.every((x) => !Number.isNaN(x)),
      `${f.name}: le values are numbers`,
    );
    assert.equal(les.at(-1), Infinity, `${f.name}: last bucket is +Inf`);
    for (let i = 1; i < buckets.length; i++) {
      assert.ok(les[i] > les[i - 1], `${f.name}: le increasing`);
      assert.ok(buckets[i].value >= buckets[i - 1].value, `${f.name}: buckets cumulative`);
    }
    assert.equal(buckets.at(-1)?.value, count?.value, `${f.name}: +Inf bucket equals _count`);
  }
}

function series(fams: Map<string, Family>, name: string): Sample[] {
  return fams.get(name)?.samples ?? [];
}

// ---------------------------------------------------------------------------------------------------

test('the parser itself rejects the broken line seen in production and accepts escapes', () => {
  assert.throws(() => parsePrometheusText('# TYPE x counter\nx{route="/q"z\\"} 1\n'));
  assert.throws(() => parsePrometheusText('# TYPE x counter\nx{route="a\\q"} 1\n'), /invalid escape/);
  assert.throws(() => parsePrometheusText('x 1\nx 2\n'), /duplicate series/);
  assert.throws(() => parsePrometheusText('x 1\ny 1\nx{a="b"} 2\n'), /not contiguous/);
  const ok = parsePrometheusText('# HELP x a\\\\b\n# TYPE x counter\nx{route="/q\\"z\\\\\\n"} 1\n');
  assert.equal(ok.get('x')?.samples[0].labels.route, '/q"z\\\n');
  assert.equal(ok.get('x')?.help, 'a\\b');
});

test('/metrics stays valid under hostile paths; unknown routes are one series; counts are exact', async () => {
  const { port } = await start();
  const hostile = [
    '/q"z\\',
    '/"',
    '/\\',
    '/\\"}\\n_x_1',
    '/a%0Ab',
    '/a%0A%0Drstar2_sandbox_queue_depth%201',
    '/%22%5C',
    '/{route="x"}',
    '/metrics/extra',
    '/pingx',
  ];
  let other = 0;
  for (const p of hostile) {
    const r = await send(port, 'GET', p);
    assert.equal(r.status, 404, `${p} reaches the service and is answered 404`);
    other++;
  }
  // 1000 distinct random paths, some with characters that need escaping
  const random = Array.from({ length: 1000 }, (_, i) => {
    const id = randomBytes(6).toString('hex');
    return i % 3 === 0 ? `/r/${id}"\\` : i % 3 === 1 ? `/r/${id}%0A` : `/${id}`;
  });
  for (let i = 0; i < random.length; i += 50) {
    const rs = await Promise.all(random.slice(i, i + 50).map((p) => send(port, 'GET', p)));
    for (const r of rs) assert.equal(r.status, 404);
    other += rs.length;
  }
  // unknown POST routes and methods count as "other" too
  assert.equal((await send(port, 'POST', '/nope"', '{}')).status, 404);
  other++;
  // known routes
  for (let i = 0; i < 3; i++) assert.equal((await send(port, 'GET', '/ping')).status, 200);
  for (let i = 0; i < 5; i++)
    assert.equal((await send(port, 'POST', '/v1/run', JSON.stringify({ code: `x${i}` }))).status, 200);
  assert.equal((await send(port, 'GET', '/status')).status, 200);

  const m = await send(port, 'GET', '/metrics');
  assert.equal(m.status, 200);
  assert.match(m.type, /^text\/plain; version=0\.0\.4/);
  const fams = parsePrometheusText(m.text);

  const reqs = series(fams, 'rstar2_sandbox_requests_total');
  assert.equal(fams.get('rstar2_sandbox_requests_total')?.type, 'counter');
  const byRoute = Object.fromEntries(reqs.map((s) => [s.labels.route, s.value]));
  assert.deepEqual(byRoute, { other, '/ping': 3, '/v1/run': 5, '/status': 1, '/metrics': 1 });
  assert.equal(reqs.filter((s) => s.labels.route === 'other').length, 1, 'unknown routes are one series');
  assert.equal(other, hostile.length + 1000 + 1);

  // every documented rstar2_sandbox_ metric is still there, with its type
  const want: Record<string, string> = {
    rstar2_sandbox_queue_depth: 'gauge',
    rstar2_sandbox_in_flight: 'gauge',
    rstar2_sandbox_clients_waiting: 'gauge',
    rstar2_sandbox_requests_total: 'counter',
    rstar2_sandbox_busy_rejections_total: 'counter',
    rstar2_sandbox_items_total: 'counter',
    rstar2_sandbox_item_latency_seconds: 'histogram',
  };
  for (const [name, type] of Object.entries(want)) assert.equal(fams.get(name)?.type, type, name);
  assert.deepEqual(
    series(fams, 'rstar2_sandbox_items_total').map((s) => [s.labels.status, s.value]),
    [['ok', 5]],
  );
  assert.equal(
    series(fams, 'rstar2_sandbox_item_latency_seconds').find((s) => s.name.endsWith('_count'))?.value,
    5,
  );
  assert.equal(series(fams, 'rstar2_sandbox_queue_depth')[0].value, 0);
  assert.equal(series(fams, 'rstar2_sandbox_busy_rejections_total')[0].value, 0);

  // process and event-loop metrics
  for (const name of [
    'process_cpu_user_seconds_total',
    'process_resident_memory_bytes',
    'process_start_time_seconds',
    'nodejs_eventloop_lag_seconds',
    'nodejs_eventloop_lag_p99_seconds',
    'nodejs_heap_size_used_bytes',
  ])
    assert.ok(fams.has(name), `${name} is exported`);
});

test('two servers in one process keep separate counts and both scrape cleanly', async () => {
  const a = await start();
  const b = await start();
  for (let i = 0; i < 4; i++) await send(a.port, 'POST', '/v1/run', JSON.stringify({ code: 'a' }));
  await send(b.port, 'POST', '/v1/run', JSON.stringify({ code: 'b' }));
  await send(b.port, 'GET', '/x"y');
  const fa = parsePrometheusText((await send(a.port, 'GET', '/metrics')).text);
  const fb = parsePrometheusText((await send(b.port, 'GET', '/metrics')).text);
  const count = (f: Map<string, Family>, route: string) =>
    series(f, 'rstar2_sandbox_requests_total').find((s) => s.labels.route === route)?.value;
  assert.equal(count(fa, '/v1/run'), 4);
  assert.equal(count(fb, '/v1/run'), 1);
  assert.equal(count(fa, 'other'), undefined);
  assert.equal(count(fb, 'other'), 1);
  assert.ok(fa.has('nodejs_eventloop_lag_seconds') && fb.has('nodejs_eventloop_lag_seconds'));
});

test('busy refusals and item outcomes are counted', async () => {
  const release: Array<() => void> = [];
  const { port } = await start({
    // holds every item until released, so the second one queues and a third is refused
    runner: new FakeRunner((req) => new Promise((r) => release.push(() => r(okResult(req))))),
    concurrency: 1,
    maxQueue: 1,
  });
  const first = send(port, 'POST', '/v1/run', JSON.stringify({ code: 'a' }));
  const second = send(port, 'POST', '/v1/run', JSON.stringify({ code: 'b' }));
  await new Promise((r) => setTimeout(r, 100));
  const busy = await send(
    port,
    'POST',
    '/v1/batch',
    JSON.stringify({ requests: [{ code: 'c' }, { code: 'd' }] }),
  );
  assert.equal(busy.status, 503);
  const f = parsePrometheusText((await send(port, 'GET', '/metrics')).text);
  assert.equal(series(f, 'rstar2_sandbox_busy_rejections_total')[0].value, 1);
  assert.equal(series(f, 'rstar2_sandbox_in_flight')[0].value, 1);
  assert.equal(series(f, 'rstar2_sandbox_queue_depth')[0].value, 1);
  assert.equal(series(f, 'rstar2_sandbox_clients_waiting')[0].value, 1);
  (release.shift() as () => void)();
  assert.equal((await first).status, 200);
  await new Promise((r) => setTimeout(r, 50));
  (release.shift() as () => void)();
  assert.equal((await second).status, 200);
  const g = parsePrometheusText((await send(port, 'GET', '/metrics')).text);
  assert.deepEqual(
    series(g, 'rstar2_sandbox_items_total').map((x) => [x.labels.status, x.value]),
    [['ok', 2]],
  );
  assert.equal(series(g, 'rstar2_sandbox_in_flight')[0].value, 0);
});
