import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runRollouts } from '../../src/agent/loop.js';
import { agentTemplate } from '../../src/agent/template.js';
import { EmbeddedEngine } from '../../src/engines/embedded.js';
import { buildCharTokenizer, ChatTemplate, tokenizerFromFiles } from '../../src/tokenizer/index.js';
import { MODEL_PRESETS, PolicyWorker } from '../../src/worker/index.js';
import { FakeRunner } from '../agent/helpers.js';

test('EmbeddedEngine over a real torch PolicyWorker: concurrent trajectories share batched generate calls', {
  timeout: 180_000,
}, async () => {
  const tok = tokenizerFromFiles(buildCharTokenizer());
  const worker = await PolicyWorker.start({ threads: 1 });
  try {
    await worker.init({ ...MODEL_PRESETS.tiny, vocab_size: tok.vocabSize }, 7);
    const engine = new EmbeddedEngine(worker, { capacityTokens: 1 << 20 });
    const template = agentTemplate(tok, { chat: ChatTemplate.named('compact') });
    const ts = await runRollouts({
      engines: [engine],
      schedulerOptions: { pollMs: 0 },
      template,
      runner: new FakeRunner(),
      problems: [
        { id: 'a', question: '1+1?' },
        { id: 'b', question: '2+2?' },
      ],
      n: 3,
      maxResponseTokens: 24,
      sampling: { temperature: 1, seed: 3 },
    });
    assert.equal(ts.length, 6);
    for (const t of ts) {
      assert.notEqual(t.finish, 'error', t.error);
      assert.ok(t.responseIds.length > 0 && t.responseIds.length <= 24);
      assert.equal(t.responseLogprobs.length, t.responseIds.length);
      t.responseIds.forEach((id, i) => {
        assert.ok(id >= 0 && id < tok.vocabSize);
        if (t.responseMask[i] === 1)
          assert.ok(t.responseLogprobs[i] <= 0 && Number.isFinite(t.responseLogprobs[i]));
      });
    }
    const gens = ts.reduce((a, t) => a + t.events.filter((e) => e.kind === 'generation').length, 0);
    assert.ok(engine.batches < gens, `${engine.batches} worker calls for ${gens} generations`);
  } finally {
    await worker.close();
  }
});
