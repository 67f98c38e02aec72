export {
  DEFAULT_PENALTY_OPTIONS,
  type PenaltyOptions,
  rocAnswerFormatPenalty,
  rocErrorRatioPenalty,
  rocPenalty,
} from './penalty.js';
export {
  DEFAULT_ROC,
  type EqualKind,
  groupAdvantages,
  type RocConfig,
  type RocSelection,
  rejectEqualReward,
  resampleOnCorrect,
  roundHalfEven,
} from './roc.js';
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
