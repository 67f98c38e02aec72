// Public entry point `rstar2/reward`: the verifier. `verify(pred, gold, opts)` compares a response (or a
// bare answer) with a gold answer; `scoreTrajectory(t, gold, profile)` is the one reward train, eval and
// rollout use; `VerifierPool` runs checks in worker threads with a hard time limit.
export * from '../reward/index.js';
