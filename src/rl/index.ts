export {
  DEFAULT_PENALTY_OPTIONS,
  type PenaltyOptions,
  penaltyOptions,
  rocAnswerFormatPenalty,
  rocErrorRatioPenalty,
  rocPenalty,
} from './penalty.js';
export {
  DEFAULT_ROC,
  type EqualKind,
  groupAdvantages,
  type RocConfig,
  RocSchema,
  type RocSelection,
  rejectEqualReward,
  resampleOnCorrect,
  roundHalfEven,
} from './roc.js';
export { type LrSchedule, type MiniBatchPlan, miniBatchPlan, stageLr, warmupLr } from './schedule.js';
export {
  type KeptTrace,
  type RocMetrics,
  type Scored,
  type SelectionResult,
  selectAndScore,
} from './step.js';
export {
  failureOf,
  sandboxFaultOf,
  type Trajectory,
  type TrajectoryFinish,
  type TurnEvent,
} from './trajectory.js';
