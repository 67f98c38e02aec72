export { loadRewardModule } from './custom.js';
export { type Extracted, extractAnswer, extractGold, extractPrime, extractReference } from './extract.js';
export { normalise, RULES } from './normalise.js';
export { type PoolOptions, VerifierPool, type VerifyItem } from './pool.js';
export type { VerifyOptions, VerifyProfile, VerifyResult } from './types.js';
export {
  checkProfile,
  DEFAULTS,
  PROFILE_NAMES,
  PROFILES,
  type Scored,
  scoreTrajectory,
  verify,
} from './verify.js';
