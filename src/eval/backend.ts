import { fakeTrajectory } from './fake.js';
import { perRequest, type RolloutFn } from './run.js';

export interface BackendOptions {
  model?: string; // checkpoint directory (embedded engine)
  engine?: string; // http(s) URL of a served engine, or fake:ACC
  temperature: number;
  topP: number;
  maxTokens?: number;
  concurrency: number;
}

export interface Backend {
  name: string;
  rollout: RolloutFn;
  close(): Promise<void>;
}

// Picks the rollout for an eval or chat: the agent loop over the requested engine, or the synthetic
// `fake:ACC` policy used to dry-run the plumbing.
export async function openBackend(o: BackendOptions): Promise<Backend> {
  if (Boolean(o.model) === Boolean(o.engine))
    throw new Error('give exactly one of --model DIR or --engine URL');
  const fake = o.engine ? /^fake(?::([0-9.]+))?$/.exec(o.engine) : null;
  if (fake) {
    const acc = fake[1] === undefined ? 0.5 : Number(fake[1]);
    if (!(acc >= 0 && acc <= 1)) throw new Error(`--engine fake:ACC needs 0 <= ACC <= 1 (got ${fake[1]})`);
    return {
      name: `fake:${acc}`,
      rollout: perRequest(async (r) => fakeTrajectory(r, acc), o.concurrency),
      close: async () => {},
    };
  }
  // The agent loop (agent/) owns engine construction, templates and the sandbox tool.
  type AgentModule = { openEvalBackend?: (o: BackendOptions) => Promise<Backend> };
  let agent: AgentModule = {};
  try {
    const spec = '../agent/index.js';
    agent = (await import(spec)) as AgentModule;
  } catch (e) {
    throw new Error(`the agent loop (src/agent/index.ts) is not available: ${(e as Error).message}`);
  }
  if (typeof agent.openEvalBackend !== 'function') {
    throw new Error(
      'the agent loop does not export openEvalBackend(options) yet; only --engine fake:ACC works',
    );
  }
  return agent.openEvalBackend(o);
}
