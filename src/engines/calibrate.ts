// Fits an engine's time model from measured samples, so the scheduling simulation can run on a
// user's own constants instead of assumed ones. Decode step: ms = base + kvMs · resident KV tokens +
// seqMs · batch; prefill: ms = prefillBaseMs + prefillMsPerToken · tokens. Both by least squares, no constant
// below zero.

export interface StepSample {
  batch: number;
  kv: number; // KV tokens of the running batch
  ms: number;
}

export interface PrefillSample {
  tokens: number;
  ms: number;
}

export interface EngineTimeModel {
  stepBaseMs: number;
  kvMsPerToken: number;
  seqMs: number;
  prefillBaseMs: number;
  prefillMsPerToken: number;
}

/** Ordinary least squares: the coefficients b minimising |X b − y|², by the normal equations. */
export function leastSquares(x: number[][], y: number[]): number[] {
  const k = x[0]?.length ?? 0;
  if (x.length < k || k === 0)
    throw new Error(`least squares needs at least ${k || 1} samples, got ${x.length}`);
  // augmented [XᵀX | Xᵀy], solved by Gauss-Jordan with partial pivoting
  const a = Array.from({ length: k }, (_, i) => {
    const row = new Array<number>(k + 1).fill(0);
    for (let r = 0; r < x.length; r++) {
      for (let j = 0; j < k; j++) row[j] += x[r][i] * x[r][j];
      row[k] += x[r][i] * y[r];
    }
    return row;
  });
  for (let c = 0; c < k; c++) {
    let p = c;
    for (let r = c + 1; r < k; r++) if (Math.abs(a[r][c]) > Math.abs(a[p][c])) p = r;
    if (Math.abs(a[p][c]) < 1e-12 * Math.max(1, Math.abs(a[c][c])))
      throw new Error('least squares: samples do not vary enough to separate the constants');
    [a[c], a[p]] = [a[p], a[c]];
    for (let r = 0; r < k; r++) {
      if (r === c) continue;
      const f = a[r][c] / a[c][c];
      for (let j = c; j <= k; j++) a[r][j] -= f * a[c][j];
    }
  }
  return a.map((row, i) => row[k] / row[i]);
}

/** Least squares with every coefficient ≥ 0: a time constant below zero is a fit's artefact (a kernel that runs
 *  below its bandwidth at small sizes bends the line and pulls the intercept under zero, which made a simulated
 *  100-token prefill take negative time). The models here have 2 or 3 constants, so every subset of them is fitted
 *  and the non-negative fit with the least squared error wins (the constrained optimum, which dropping the most
 *  negative constant one at a time can miss). */
export function nonNegativeLeastSquares(x: number[][], y: number[]): number[] {
  const k = x[0]?.length ?? 0;
  const free = leastSquares(x, y); // refuses samples that cannot separate the constants, saying so
  if (free.every((v) => v >= 0)) return free;
  let best = new Array<number>(k).fill(0);
  let bestErr = y.reduce((a, v) => a + v * v, 0);
  for (let mask = 1; mask < 1 << k; mask++) {
    const cols = [...Array(k).keys()].filter((j) => mask & (1 << j));
    let b: number[];
    try {
      b = leastSquares(
        x.map((row) => cols.map((j) => row[j])),
        y,
      );
    } catch {
      continue; // these columns alone cannot be separated
    }
    if (b.some((v) => v < 0)) continue;
    const full = new Array<number>(k).fill(0);
    cols.forEach((j, i) => {
      full[j] = b[i];
    });
    const err = x.reduce((a, row, r) => a + (row.reduce((t, v, j) => t + v * full[j], 0) - y[r]) ** 2, 0);
    if (err < bestErr) [best, bestErr] = [full, err];
  }
  return best;
}

export function fitEngineModel(steps: StepSample[], prefills: PrefillSample[]): EngineTimeModel {
  if (steps.length === 0 || prefills.length === 0)
    throw new Error(
      `calibration needs both kinds of sample: ${steps.length} decode steps {batch, kv, ms} and ` +
        `${prefills.length} prefills {tokens, ms}`,
    );
  // columns scaled to similar magnitudes so the normal equations stay well conditioned
  const kvScale = Math.max(1, ...steps.map((s) => s.kv));
  const batchScale = Math.max(1, ...steps.map((s) => s.batch));
  const [b0, b1, b2] = nonNegativeLeastSquares(
    steps.map((s) => [1, s.kv / kvScale, s.batch / batchScale]),
    steps.map((s) => s.ms),
  );
  const tokScale = Math.max(1, ...prefills.map((p) => p.tokens));
  const [p0, p1] = nonNegativeLeastSquares(
    prefills.map((p) => [1, p.tokens / tokScale]),
    prefills.map((p) => p.ms),
  );
  return {
    stepBaseMs: b0,
    kvMsPerToken: b1 / kvScale,
    seqMs: b2 / batchScale,
    prefillBaseMs: p0,
    prefillMsPerToken: p1 / tokScale,
  };
}

/** Reads a JSONL of samples: `{batch, kv, ms}` lines are decode steps, `{tokens, ms}` lines prefills. */
export function parseSamples(text: string): { steps: StepSample[]; prefills: PrefillSample[] } {
  const steps: StepSample[] = [];
  const prefills: PrefillSample[] = [];
  for (const [i, line] of text.split('\n').entries()) {
    if (!line.trim()) continue;
    const o = JSON.parse(line) as Record<string, unknown>;
    const n = (k: string) =>
      typeof o[k] === 'number' && Number.isFinite(o[k]) ? (o[k] as number) : undefined;
    const ms = n('ms');
    if (ms === undefined) throw new Error(`samples line ${i + 1}: needs a numeric 'ms'`);
    const batch = n('batch');
    const kv = n('kv');
    const tokens = n('tokens');
    if (batch !== undefined && kv !== undefined) steps.push({ batch, kv, ms });
    else if (tokens !== undefined) prefills.push({ tokens, ms });
    else throw new Error(`samples line ${i + 1}: needs {batch, kv, ms} or {tokens, ms}`);
  }
  return { steps, prefills };
}
