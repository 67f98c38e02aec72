// `rstar2 env`: what a bug report needs to say about the machine, as `trl env` and torch's collect_env say it.
// Every probe runs for real (the worker's interpreter imports torch; the sandbox runs one call), so a broken
// piece shows here as what is wrong with it rather than as a failure later in a run.
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { availableParallelism, cpus, release, totalmem } from 'node:os';
import type { Command } from 'commander';
import { findPython, projectVenv } from '../util/python.js';

const ROOT = new URL('../../', import.meta.url).pathname;

const WORKER_PROBE = `
import json, platform, sys
from importlib.metadata import PackageNotFoundError, version
out = {"python": platform.python_version(), "packages": {}}
for p in ("torch", "transformers", "safetensors", "tokenizers", "numpy", "accelerate"):
    try:
        out["packages"][p] = version(p)
    except PackageNotFoundError:
        out["packages"][p] = None
try:
    import torch
    import torch.distributed as dist
    out["cuda"] = torch.version.cuda
    out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    out["backends"] = [b for b, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available())) if ok]
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
`;

const SANDBOX_PROBE = `
import json, platform
from importlib.util import find_spec
print(json.dumps({"python": platform.python_version(),
                  "modules": {m: find_spec(m) is not None for m in ("numpy", "sympy", "seccomp")}}))
`;

function probe(python: string, code: string): Record<string, unknown> {
  const r = spawnSync(python, ['-c', code], { encoding: 'utf8', timeout: 60_000 });
  if (r.status === 0) return JSON.parse(r.stdout);
  return { error: (r.stderr.trim().split('\n').pop() || r.error?.message || `exit ${r.status}`).trim() };
}

function located(env: 'RSTAR2_PYTHON' | 'RSTAR2_SANDBOX_PYTHON'): { path?: string; error?: string } {
  try {
    return { path: findPython(undefined, env) };
  } catch (e) {
    return { error: (e as Error).message };
  }
}

function osName(): string {
  try {
    const m = /^PRETTY_NAME="?([^"\n]*)"?$/m.exec(readFileSync('/etc/os-release', 'utf8'));
    if (m) return `${m[1]}, Linux ${release()}`;
  } catch {}
  return `${process.platform} ${release()}`;
}

function gitCommit(): string | null {
  const r = spawnSync('git', ['-C', ROOT, 'rev-parse', '--short', 'HEAD'], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : null;
}

/** Start a one-slot sandbox with the default settings and run one call through it. */
async function sandboxProbe(): Promise<Record<string, unknown>> {
  const { SandboxPool } = await import('../sandbox/index.js');
  let pool: Awaited<ReturnType<typeof SandboxPool.start>> | undefined;
  try {
    pool = await SandboxPool.start({ slots: 1, log: () => {} });
    const r = await pool.run({ code: 'print(6 * 7)' });
    const ok = r.status === 'ok' && r.stdout.trim() === '42';
    return {
      isolation: pool.info.isolation,
      landlockAbi: pool.info.landlock,
      works: ok,
      ...(ok
        ? {}
        : { error: `a test call gave ${r.status}: ${(r.stderr || r.stdout).trim().slice(0, 200)}` }),
      notes: pool.info.notes,
    };
  } catch (e) {
    return { works: false, error: (e as Error).message };
  } finally {
    await pool?.close();
  }
}

export async function collectEnv(opts: { sandbox: boolean }): Promise<Record<string, unknown>> {
  const pkg = JSON.parse(readFileSync(`${ROOT}package.json`, 'utf8'));
  const worker = located('RSTAR2_PYTHON');
  const sandboxPython = located('RSTAR2_SANDBOX_PYTHON');
  return {
    rstar2: { version: pkg.version, commit: gitCommit() },
    node: process.version,
    os: osName(),
    cpu: { model: cpus()[0]?.model ?? 'unknown', cores: availableParallelism() },
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    worker: {
      ...worker,
      source: process.env.RSTAR2_PYTHON
        ? 'RSTAR2_PYTHON'
        : worker.path?.startsWith(projectVenv())
          ? 'project venv'
          : 'default',
      ...(worker.path ? probe(worker.path, WORKER_PROBE) : {}),
    },
    sandbox: {
      python: { ...sandboxPython, ...(sandboxPython.path ? probe(sandboxPython.path, SANDBOX_PROBE) : {}) },
      ...(opts.sandbox ? await sandboxProbe() : { skipped: '--no-sandbox' }),
    },
  };
}

const yesNo = (b: unknown) => (b ? 'yes' : 'no');

function lines(e: Record<string, any>): string[] {
  const w = e.worker;
  const pk = w.packages ?? {};
  const s = e.sandbox;
  const sp = s.python;
  const out = [
    `rstar2: ${e.rstar2.version}${e.rstar2.commit ? ` (git ${e.rstar2.commit})` : ''}`,
    `Node: ${e.node}`,
    `OS: ${e.os}`,
    `CPU: ${e.cpu.model}, ${e.cpu.cores} cores; memory ${e.memoryGiB} GiB`,
    `worker Python: ${w.path ?? 'NOT FOUND'}${w.python ? ` (${w.python}, ${w.source})` : ''}`,
  ];
  if (w.error) out.push(`  error: ${w.error}`);
  if (w.packages) {
    out.push(
      `  torch: ${pk.torch ?? 'not installed'}; CUDA: ${w.cuda ?? 'none'}; GPUs: ${w.gpus?.length ? w.gpus.join(', ') : 'none'}; distributed: ${w.backends?.join(', ') || 'none'}`,
      `  transformers: ${pk.transformers ?? 'not installed'}; safetensors: ${pk.safetensors ?? '-'}; tokenizers: ${pk.tokenizers ?? '-'}; numpy: ${pk.numpy ?? '-'}; accelerate: ${pk.accelerate ?? '-'}`,
    );
  }
  out.push(`sandbox Python: ${sp.path ?? 'NOT FOUND'}${sp.python ? ` (${sp.python})` : ''}`);
  if (sp.error) out.push(`  error: ${sp.error}`);
  if (sp.modules)
    out.push(
      `  numpy: ${yesNo(sp.modules.numpy)}; sympy: ${yesNo(sp.modules.sympy)}; seccomp: ${yesNo(sp.modules.seccomp)}`,
    );
  if (s.skipped) out.push(`sandbox: not probed (${s.skipped})`);
  else {
    out.push(
      `sandbox: ${s.works ? 'works' : 'FAILS'}${s.isolation ? `, isolation ${s.isolation}` : ''}${s.landlockAbi ? `, Landlock ABI ${s.landlockAbi}` : ''}`,
    );
    if (s.error) out.push(`  error: ${s.error}`);
    for (const n of s.notes ?? []) out.push(`  note: ${n}`);
  }
  return out;
}

export function registerEnvCommand(program: Command): void {
  program
    .command('env')
    .description(
      "Print this machine's setup for a bug report: worker Python, torch, CUDA, GPUs, transformers, the sandbox's interpreter and isolation, Node, OS, CPU",
    )
    .option('--json', 'print one JSON object', false)
    .option('--no-sandbox', 'do not start a sandbox to check its isolation (it takes a second or two)')
    .action(async (o: { json: boolean; sandbox: boolean }) => {
      const e = await collectEnv({ sandbox: o.sandbox });
      console.log(o.json ? JSON.stringify(e, null, 2) : lines(e).join('\n'));
    });
}
