// The trainer watches its own health: a run that is not learning says so in the terminal, in metrics.jsonl
// (`health` on the step's record) and on the dashboard, instead of ending as if it had worked. With
// `health.strict` (`--strict-health`) the first warning stops the run after its checkpoint (exit 3).

export type HealthCode =
  | 'all_groups_skipped'
  | 'zero_reward'
  | 'tool_errors_all'
  | 'nonfinite_loss'
  | 'sft_gate_not_reached'
  | 'no_heldout_gain'
  | 'rollout_failures'
  | 'no_progress';

export interface HealthWarning {
  code: HealthCode;
  message: string;
}

export class HealthError extends Error {
  constructor(readonly warnings: HealthWarning[]) {
    super(`unhealthy run (strict health): ${warnings.map((w) => w.message).join('; ')}`);
  }
}

export interface RlStepView {
  stage: string;
  step: number;
  rewardMean: number;
  groupsKept: number;
  groups: number;
  /** Groups dropped because every rollout was correct. */
  groupsAllCorrect: number;
  toolCalls: number;
  toolErrors: number;
  loss?: number;
  trajectories: number;
  /** Trajectories that failed for reasons outside the model (failureOf), and the first one's reason. */
  failed: number;
  failure?: string;
}

export class Health {
  private zeroStreak = 0;

  constructor(private readonly zeroRewardSteps: number) {}

  rlStep(v: RlStepView): HealthWarning[] {
    const out: HealthWarning[] = [];
    const at = `${v.stage} step ${v.step}`;
    if (v.groups > 0 && v.groupsKept === 0) {
      const why =
        v.groupsAllCorrect === v.groups
          ? 'every prompt was solved by all its rollouts: the data is too easy to learn from'
          : "each prompt's rollouts got equal rewards";
      out.push({ code: 'all_groups_skipped', message: `${at}: every group was skipped (${why}), no update` });
    }
    this.zeroStreak = v.rewardMean === 0 ? this.zeroStreak + 1 : 0;
    if (this.zeroStreak === this.zeroRewardSteps)
      out.push({
        code: 'zero_reward',
        message: `${at}: reward has been 0 for ${this.zeroStreak} consecutive steps: the policy solves nothing`,
      });
    if (v.toolCalls > 0 && v.toolErrors >= v.toolCalls)
      out.push({
        code: 'tool_errors_all',
        message: `${at}: all ${v.toolCalls} tool calls failed`,
      });
    if (v.loss !== undefined && !Number.isFinite(v.loss))
      out.push({ code: 'nonfinite_loss', message: `${at}: loss is ${v.loss}` });
    if (v.failed > 0) out.push(failuresWarning(at, v.failed, v.trajectories, v.failure, 'training'));
    return out;
  }

  /** A streak does not carry over into another stage. */
  resetStage(): void {
    this.zeroStreak = 0;
  }
}

/** Samples an engine or the sandbox failed are left out of `what`; the run says how many, and why. */
export function failuresWarning(
  at: string,
  failed: number,
  total: number,
  failure: string | undefined,
  what: string,
): HealthWarning {
  return {
    code: 'rollout_failures',
    message: `${at}: ${failed} of ${total} trajectories failed outside the model (first: ${failure}) and were left out of ${what}`,
  };
}

/** Nothing finished for `minutes` (health.stallMinutes): a hung engine, sandbox or check, said while it lasts. */
export function stallWarning(at: string, phase: string, minutes: number): HealthWarning {
  return {
    code: 'no_progress',
    message: `${at}: no step finished for ${minutes.toFixed(1)} min (now in ${phase}); the run may be stuck`,
  };
}

export function sftLossWarning(stage: string, step: number, loss: number): HealthWarning[] {
  return Number.isFinite(loss)
    ? []
    : [{ code: 'nonfinite_loss', message: `${stage} step ${step}: loss is ${loss}` }];
}

export interface GateSpec {
  loss?: number | null;
  exact?: number | null;
}

export function gatePassed(gate: GateSpec, score: { loss: number; exact: number }): boolean {
  return (gate.loss == null || score.loss <= gate.loss) && (gate.exact == null || score.exact >= gate.exact);
}

export function describeGate(gate: GateSpec): string {
  const parts = [];
  if (gate.loss != null) parts.push(`loss <= ${gate.loss}`);
  if (gate.exact != null) parts.push(`exact >= ${gate.exact}`);
  return `gate ${parts.join(' and ')}`;
}

export function gateWarning(
  stage: string,
  cap: number,
  best: { loss: number; exact: number },
  gate: GateSpec,
): HealthWarning {
  return {
    code: 'sft_gate_not_reached',
    message: `${stage}: best held-out loss ${best.loss.toFixed(4)}, exact ${best.exact.toFixed(3)} at the ${cap}-step cap, ${describeGate(gate)} not reached`,
  };
}

export function gainWarning(stage: string, first: number, last: number): HealthWarning[] {
  return last > first || first >= 1
    ? []
    : [
        {
          code: 'no_heldout_gain',
          message: `${stage}: held-out accuracy did not rise over the stage (${pct(first)} -> ${pct(last)})`,
        },
      ];
}

/** The end-of-run line. A missed SFT gate is a stage short of its skill at its cap, not a run that is not
 *  learning: the quickstart seeds that missed their retry gate (until 27 Nov) still gained 40 points or more in RL. */
export function healthSummary(warnings: HealthWarning[]): string {
  const learning = warnings.some((w) => w.code !== 'sft_gate_not_reached');
  const why = learning ? 'the run may not be learning' : 'a stage reached its step cap before its skill gate';
  return (
    `${warnings.length} health warning(s); ${why} (see 'health' in metrics.jsonl):\n` +
    warnings.map((w) => `  - ${w.message}`).join('\n')
  );
}

const pct = (x: number) => `${(x * 100).toFixed(1)}%`;
