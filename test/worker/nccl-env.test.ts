import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { PolicyWorker } from '../../src/worker/index.js';

// SGLang and vLLM run NCCL with NCCL_CUMEM_ENABLE=0 (and SGLang with NCCL_NVLS_ENABLE=0); rank 0 of the trainer
// joins their weight-update group, so it must run NCCL the same way from its start (issue 40).

function environOf(pid: number): Record<string, string> {
  const out: Record<string, string> = {};
  for (const kv of readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0')) {
    const i = kv.indexOf('=');
    if (i > 0) out[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return out;
}

test('every worker rank starts with the engines’ NCCL settings; a value the caller gives wins', {
  timeout: 120_000,
}, async () => {
  const w = await PolicyWorker.start({ threads: 1, ranks: 2 });
  try {
    for (const pid of w.pids) {
      const env = environOf(pid);
      assert.equal(env.NCCL_CUMEM_ENABLE, '0', `rank pid ${pid}`);
      assert.equal(env.NCCL_NVLS_ENABLE, '0', `rank pid ${pid}`);
    }
  } finally {
    await w.close();
  }
  const own = await PolicyWorker.start({ threads: 1, env: { NCCL_CUMEM_ENABLE: '1' } });
  try {
    const env = environOf(own.pids[0]);
    assert.equal(env.NCCL_CUMEM_ENABLE, '1');
    assert.equal(env.NCCL_NVLS_ENABLE, '0');
  } finally {
    await own.close();
  }
});
