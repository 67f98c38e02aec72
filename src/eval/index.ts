export { listBenchmarks, loadProblems, resolveBench } from './bench.js';
export { fakeTrajectory } from './fake.js';
export { openPolicy } from './policy.js';
export {
  type EvalConfig,
  perRequest,
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
export { fallbackVerify, lastBoxed, openVerifier, type Verifier, type VerifyFn } from './verify.js';
