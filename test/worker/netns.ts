import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';

// Two network namespaces joined by a veth pair, as two nodes of a job: 10.231.0.1 and 10.231.0.2 (a /30) exist only
// inside them, so nothing reaches them from outside and nothing outside is touched. In both the host's name
// resolves to loopback, as Debian's /etc/hosts has it (`ip netns exec` reads /etc/netns/NAME/hosts as /etc/hosts):
// left to itself gloo would bind that, and the peer would never connect.

export interface TwoNodes {
  names: [string, string];
  addrs: [string, string];
  devs: [string, string]; // the veth end in each
  /** argv prefix that runs a command inside node i's namespace */
  exec(i: 0 | 1): string[];
  /** the processes running in node i's namespace */
  pids(i: 0 | 1): number[];
  /** the TCP ports something listens on in node i's namespace */
  listening(i: 0 | 1): number[];
  /** kills what still runs in the namespaces (only this test's processes can be there), then deletes them */
  close(): void;
}

const IP = ['/usr/sbin/ip', '/sbin/ip', '/usr/bin/ip', '/bin/ip'].find((p) => existsSync(p));

function ip(...args: string[]): { ok: boolean; why: string } {
  const r = spawnSync(IP as string, args, { encoding: 'utf8', timeout: 10_000 });
  return { ok: r.status === 0, why: (r.stderr || r.error?.message || '').trim() };
}

/** The namespaces, or why they cannot be made here (the test then skips, saying so). */
export function twoNodes(): TwoNodes | string {
  if (process.platform !== 'linux') return 'network namespaces are Linux only';
  if (process.getuid?.() !== 0) return 'making network namespaces needs root';
  if (!IP) return 'no `ip` command (apt-get install iproute2)';
  const tag = `r2n${process.pid}`; // interface names hold at most 15 characters: r2n, 7 digits, a/b
  const names: [string, string] = [`${tag}-0`, `${tag}-1`];
  const addrs: [string, string] = ['10.231.0.1', '10.231.0.2'];
  const devs: [string, string] = [`${tag}a`, `${tag}b`];
  const pids = (i: 0 | 1) =>
    (spawnSync(IP as string, ['netns', 'pids', names[i]], { encoding: 'utf8', timeout: 10_000 }).stdout ?? '')
      .split('\n')
      .filter(Boolean)
      .map(Number);
  const listening = (i: 0 | 1) =>
    (
      spawnSync(IP as string, ['netns', 'exec', names[i], 'ss', '-Hltn'], {
        encoding: 'utf8',
        timeout: 10_000,
      }).stdout ?? ''
    )
      .split('\n')
      .filter(Boolean)
      .map((line) => line.trim().split(/\s+/)[3]) // State Recv-Q Send-Q Local:Port Peer:Port
      .map((local) => Number(local.slice(local.lastIndexOf(':') + 1)));
  const close = () => {
    for (const i of [0, 1] as const)
      for (const pid of pids(i))
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // already gone
        }
    for (const n of names) {
      ip('netns', 'del', n); // takes the veth end inside with it
      rmSync(`/etc/netns/${n}`, { recursive: true, force: true });
    }
    ip('link', 'del', devs[0]); // in case it was made but not moved
  };
  try {
    for (const n of names) {
      mkdirSync(`/etc/netns/${n}`, { recursive: true });
      writeFileSync(`/etc/netns/${n}/hosts`, `127.0.0.1 localhost\n127.0.1.1 ${hostname()}\n`);
    }
  } catch (e) {
    close();
    return `could not write /etc/netns/*/hosts (${(e as Error).message})`;
  }
  const steps = [
    ['netns', 'add', names[0]],
    ['netns', 'add', names[1]],
    ['link', 'add', devs[0], 'type', 'veth', 'peer', 'name', devs[1]],
    ['link', 'set', devs[0], 'netns', names[0]],
    ['link', 'set', devs[1], 'netns', names[1]],
    ...names.flatMap((n, i) => {
      const dev = devs[i];
      return [
        ['-n', n, 'addr', 'add', `${addrs[i]}/30`, 'dev', dev],
        ['-n', n, 'link', 'set', dev, 'up'],
        ['-n', n, 'link', 'set', 'lo', 'up'],
      ];
    }),
  ];
  for (const s of steps) {
    const r = ip(...s);
    if (!r.ok) {
      close();
      return `could not make the test's network namespaces (ip ${s.join(' ')}: ${r.why})`;
    }
  }
  // `ip netns exec` also needs a mount namespace of its own (it remounts /sys and binds the hosts file)
  const probe = spawnSync(IP, ['netns', 'exec', names[1], 'getent', 'hosts', hostname()], {
    encoding: 'utf8',
    timeout: 10_000,
  });
  if (!/^127\.0\.1\.1\s/.test(probe.stdout ?? '')) {
    close();
    return `could not run a command in the test's network namespace with its hosts file (ip netns exec: ${(probe.stderr || probe.error?.message || probe.stdout || '').trim()})`;
  }
  return { names, addrs, devs, exec: (i) => [IP, 'netns', 'exec', names[i]], pids, listening, close };
}
