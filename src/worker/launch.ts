import { isIP } from 'node:net';

// Rank layout with torchrun's contract: each process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK (the node), MASTER_ADDR and MASTER_PORT, so a rank started by `rstar2 train`, by torchrun or by
// a Slurm script reads the same variables (python/rstar2_worker/train/dist.py).

export interface LaunchOptions {
  ranks?: number; // processes on this node (torchrun's --nproc-per-node), default 1
  nnodes?: number; // nodes in the job, default 1
  nodeRank?: number; // this node, 0 ≤ nodeRank < nnodes; node 0 holds rank 0, which the client talks to
  master?: string; // ADDR:PORT where rank 0 listens; needed with nnodes > 1 (one node: 127.0.0.1 and a free port)
}

export interface Master {
  addr: string;
  port: number;
}

export function parseMaster(s: string): Master {
  const m = /^(\[[^\]]+\]|[^:]+):(\d+)$/.exec(s);
  if (!m)
    throw new Error(
      `--master must be ADDR:PORT (e.g. 10.0.0.1:29500 or [fe80::1]:29500), got ${JSON.stringify(s)}`,
    );
  const addr = m[1].replace(/^\[|\]$/g, '');
  const port = Number(m[2]);
  if (!(port >= 1 && port <= 65535)) throw new Error(`--master port must be in 1..65535, got ${m[2]}`);
  if (m[1].startsWith('[') && isIP(addr) !== 6) throw new Error(`--master: ${m[1]} is not an IPv6 address`);
  return { addr, port };
}

/** Checks the layout; returns it with defaults filled in. */
export function checkLaunch(o: LaunchOptions): Required<Omit<LaunchOptions, 'master'>> & { master?: Master } {
  const ranks = o.ranks ?? 1;
  const nnodes = o.nnodes ?? 1;
  const nodeRank = o.nodeRank ?? 0;
  const int = (name: string, v: number, min: number) => {
    if (!Number.isInteger(v) || v < min) throw new Error(`${name} must be an integer ≥ ${min}, got ${v}`);
  };
  int('nproc-per-node', ranks, 1);
  int('nnodes', nnodes, 1);
  int('node-rank', nodeRank, 0);
  if (nodeRank >= nnodes)
    throw new Error(
      `node-rank ${nodeRank} is out of range: nodes are numbered 0..${nnodes - 1} (--nnodes ${nnodes})`,
    );
  if (nnodes > 1 && !o.master)
    throw new Error(
      `--nnodes ${nnodes} needs --master ADDR:PORT (an address of node 0 every node can reach)`,
    );
  return { ranks, nnodes, nodeRank, ...(o.master ? { master: parseMaster(o.master) } : {}) };
}

/** The environment of each local rank on this node (global rank = nodeRank × ranks + local rank). */
export function rankEnvs(o: LaunchOptions, master: Master): Record<string, string>[] {
  const { ranks, nnodes, nodeRank } = checkLaunch(o);
  return Array.from({ length: ranks }, (_, local) => ({
    RANK: String(nodeRank * ranks + local),
    LOCAL_RANK: String(local),
    WORLD_SIZE: String(nnodes * ranks),
    LOCAL_WORLD_SIZE: String(ranks),
    GROUP_RANK: String(nodeRank),
    MASTER_ADDR: master.addr,
    MASTER_PORT: String(master.port),
  }));
}
