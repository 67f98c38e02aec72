export type VerifyProfile = 'strict' | 'lenient';

export interface VerifyResult {
  correct: boolean;
  extracted: string | null; // answer text found in the prediction
  normalised: string | null;
  matchedBy: string | null; // which comparison path decided equality (e.g. 'integer', 'symbolic')
  reason: string; // short human explanation, also for 'not equal' and failures
}
