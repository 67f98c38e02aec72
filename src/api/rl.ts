// Public entry point `rstar2/rl`: GRPO-RoC data selection as pure functions. `resampleOnCorrect` is the
// Resample-on-Correct rule for one group, `groupAdvantages` the group-normalised GRPO advantages, and
// `selectAndScore` one RL step's whole selection (reject equal-reward groups -> RoC -> advantages).
// Keep this list deliberate: what is exported here is the package's promise (docs/LIBRARY.md).
export * from '../rl/index.js';
export { Rng } from '../util/rng.js';
