// Preloaded into every test file's process (scripts/test.mjs): no test file may hang the suite or leave a process
// behind. A file that runs past RSTAR2_TEST_FILE_DEADLINE_S (default 900) is ended; when a file's process ends,
// whatever it started and did not close (a worker, a server, a sandbox broker) is named and killed, so a missed
// cleanup is a visible line in the log, not a port or a CPU held for the rest of the run.
import { readdirSync, readFileSync } from 'node:fs';

function children() {
  const byParent = new Map();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      // the command may hold spaces and parentheses: the fields after the last ')' are fixed
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const [state, ppidField] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (state === 'Z') continue; // exited, not yet reaped: nothing to kill
      const ppid = Number(ppidField);
      if (!byParent.has(ppid)) byParent.set(ppid, []);
      byParent.get(ppid).push(Number(name));
    } catch {}
  }
  const out = [];
  const walk = (pid) => {
    for (const c of byParent.get(pid) ?? []) {
      out.push(c);
      walk(c);
    }
  };
  walk(process.pid);
  return out;
}

function cmdline(pid) {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ').trim().slice(0, 160);
  } catch {
    return '?';
  }
}

// tsx's esbuild service is the test file's own toolchain, not something a test started
const TOOLCHAIN = /\/@esbuild\/[^ ]*esbuild --service=/;

function killLeftovers(file) {
  const left = children().filter((p) => !TOOLCHAIN.test(cmdline(p)));
  if (!left.length) return;
  process.stderr.write(
    `test file ${file} left ${left.length} process(es) running; killing them:\n` +
      left.map((p) => `  ${p} ${cmdline(p)}\n`).join(''),
  );
  for (const p of left) {
    try {
      process.kill(p, 'SIGKILL');
    } catch {}
  }
}

if (process.env.NODE_TEST_CONTEXT?.startsWith('child') && process.platform === 'linux') {
  const file = process.argv[1] ?? '?';
  const deadline = Number(process.env.RSTAR2_TEST_FILE_DEADLINE_S ?? 900);
  process.on('exit', () => killLeftovers(file));
  setTimeout(() => {
    process.stderr.write(
      `test file ${file} ran past its deadline of ${deadline} s (RSTAR2_TEST_FILE_DEADLINE_S)\n`,
    );
    process.exit(1);
  }, deadline * 1000).unref();
}
