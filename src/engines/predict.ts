// Length prediction and KV over-commit for the 'kv-predict' policy, shared by the live Scheduler and
// bench/scheduler-sim.ts so the simulation measures the code that runs.

/**
 * Predicts a trajectory's final response length (tool tokens included) from the length it has
 * reached: the mean of the previous RL step's lengths that are at least that long, pulled towards
 * the same conditional mean over its finished siblings (same prompt), which share its difficulty.
 * Without history it assumes the whole budget (worst case), so a first step is never over-committed
 * by a guess.
 */
export class LengthModel {
  private prior: number[] = []; // previous step's final lengths, sorted
  private suffix: number[] = [0];
  private current: number[] = [];
  private readonly siblings = new Map<string, number[]>();

  constructor(
    readonly budget: number,
    readonly siblingWeight = 4, // one finished sibling weighs as much as this many prior samples
  ) {}

  /** Whether a finished step (or seed) gave it lengths to predict from. */
  get trained(): boolean {
    return this.prior.length > 0;
  }

  /** Starts from a known length distribution (e.g. the previous step's) instead of the worst case. */
  seed(lengths: number[]): void {
    this.prior = [...lengths].sort((a, b) => a - b);
    this.suffix = new Array<number>(this.prior.length + 1).fill(0);
    for (let k = this.prior.length - 1; k >= 0; k--) this.suffix[k] = this.suffix[k + 1] + this.prior[k];
  }

  record(group: string | undefined, length: number): void {
    this.current.push(length);
    if (group === undefined) return;
    const s = this.siblings.get(group);
    if (s) s.push(length);
    else this.siblings.set(group, [length]);
  }

  /**
   * The share of this step's log-length variance that lies between prompts (the intraclass correlation of a
   * one-way random-effects ANOVA over groups of siblings); the rest is each sample's own and no scheduler can
   * know it before the sample runs. `bench/scheduler-sim.ts --prompt-share` takes it. Undefined with fewer
   * than two groups of two.
   */
  promptShare(): number | undefined {
    const groups = [...this.siblings.values()]
      .filter((g) => g.length >= 2)
      .map((g) => g.map((x) => Math.log(x + 1)));
    const n = groups.reduce((a, g) => a + g.length, 0);
    if (groups.length < 2) return undefined;
    const mean = groups.flat().reduce((a, b) => a + b, 0) / n;
    let between = 0;
    let within = 0;
    for (const g of groups) {
      const m = g.reduce((a, b) => a + b, 0) / g.length;
      between += g.length * (m - mean) ** 2;
      for (const y of g) within += (y - m) ** 2;
    }
    const msb = between / (groups.length - 1);
    const msw = within / (n - groups.length);
    const n0 = (n - groups.reduce((a, g) => a + g.length ** 2, 0) / n) / (groups.length - 1);
    const sb = Math.max(0, (msb - msw) / n0);
    return sb + msw > 0 ? sb / (sb + msw) : undefined;
  }

  /** Ends an RL step: this step's lengths become the prior, sibling memory is dropped. */
  nextStep(): void {
    if (this.current.length > 0) this.seed(this.current);
    this.current = [];
    this.siblings.clear();
  }

  /** `running`: how far the prompt's in-flight siblings have got; each is a lower bound on its own final
   *  length and counts, at half a finished sibling's weight, as the prior's mean above it. */
  predict(group: string | undefined, soFar: number, running: readonly number[] = []): number {
    const n = this.prior.length - lowerBound(this.prior, soFar);
    let mean = this.above(soFar);
    const sib = group === undefined ? undefined : this.siblings.get(group);
    let s = 0;
    let w = 0;
    for (const x of sib ?? []) {
      if (x < soFar) continue;
      s += x * this.siblingWeight;
      w += this.siblingWeight;
    }
    for (const r of running) {
      const e = this.above(Math.max(r, soFar));
      s += (e * this.siblingWeight) / 2;
      w += this.siblingWeight / 2;
    }
    if (w > 0) {
      const wp = Math.min(n, 16); // the prior's weight is capped: siblings are the better evidence
      mean = (mean * wp + s) / (wp + w);
    }
    return Math.min(this.budget, Math.max(soFar + 1, mean));
  }

  /** Mean of the prior's lengths ≥ g; the budget when nothing that long was seen. */
  private above(g: number): number {
    const lo = lowerBound(this.prior, g);
    const n = this.prior.length - lo;
    return n > 0 ? this.suffix[lo] / n : this.budget;
  }
}

/**
 * How far placed work may exceed an engine's KV pool, as a fraction of it. Starts at `start`, and
 * each over-subscription event the engine reports (a retraction, or a returning turn whose prefix
 * was evicted) takes `step` off; each finished trajectory without one gives `step / 8` back. The
 * engine's own retraction stays the backstop; this keeps it rare.
 */
export class Overcommit {
  value: number;
  events = 0;

  constructor(
    readonly start = 0.1,
    readonly min = -0.2,
    readonly max = 0.5,
    readonly step = 0.02,
  ) {
    this.value = start;
  }

  pressure(n = 1): void {
    this.events += n;
    this.value = Math.max(this.min, this.value - this.step * n);
  }

  clean(): void {
    this.value = Math.min(this.max, this.value + this.step / 8);
  }
}

function lowerBound(sorted: number[], x: number): number {
  let lo = 0;
  let hi = sorted.length;
  while (lo < hi) {
    const m = (lo + hi) >> 1;
    if (sorted[m] < x) lo = m + 1;
    else hi = m;
  }
  return lo;
}
