export { listBenchmarks, loadProblems, resolveBench } from './bench.js';
export { fakeTrajectory } from './fake.js';
export { type EvalPolicy, openPolicy } from './policy.js';
export {
  type EvalConfig,
  perRequest,
  problemsFromSamples,
  type RolloutFn,
  type RolloutRequest,
  readEvalDir,
  rescoreEvalDir,
  reverifyEvalDir,
  runEval,
} from './run.js';
export {
  type BenchProblem,
  type EvalReport,
  majorityVote,
  normaliseAnswer,
  passAtK,
  renderMarkdown,
  scoreEval,
} from './score.js';
export {
  dedupe,
  type IndexEntry,
  resumeTrajectoryFile,
  TrajectoryIndex,
  type TrajSummary,
} from './trajfile.js';
export { fallbackVerify, lastBoxed, openVerifier, type Verifier, type VerifyFn } from './verify.js';
