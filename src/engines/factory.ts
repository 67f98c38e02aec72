import { LlamaCppEngine } from './llamacpp.js';
import { SGLangEngine } from './sglang.js';
import { BACKENDS, type Backend, type Engine } from './types.js';
import { VllmEngine } from './vllm.js';

export { BACKENDS, type Backend };

export interface RemoteEngineOptions {
  backend?: Backend; // for plain http(s) URLs; default 'sglang'
  capacityTokens?: number;
  timeoutMs?: number;
  retries?: number;
  model?: string; // vLLM served model name
}

/** `sglang+http://h:p`, `vllm+http://…`, `llamacpp+http://…`, or a plain URL with opts.backend. */
export function remoteEngine(spec: string, opts: RemoteEngineOptions = {}): Engine {
  const m = /^(\w+)\+(https?:\/\/.*)$/.exec(spec);
  const backend = (m ? m[1] : (opts.backend ?? 'sglang')) as Backend;
  const url = m ? m[2] : spec;
  if (!BACKENDS.includes(backend)) {
    throw new Error(`unknown engine backend '${backend}' in '${spec}' (use ${BACKENDS.join(', ')})`);
  }
  if (backend === 'sglang') return new SGLangEngine(url, opts);
  if (backend === 'vllm') return new VllmEngine(url, opts);
  return new LlamaCppEngine(url, opts);
}
