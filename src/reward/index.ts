export { type Extracted, extractAnswer, extractGold } from './extract.js';
export { normalise, RULES } from './normalise.js';
export { type PoolOptions, VerifierPool, type VerifyItem } from './pool.js';
export type { VerifyOptions, VerifyProfile, VerifyResult } from './types.js';
export { DEFAULTS, PROFILES, scoreTrajectoryText, verify } from './verify.js';
