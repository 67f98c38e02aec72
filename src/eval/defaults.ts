// Eval defaults the CLI shows in --help, apart from the modules that use them so that registering the command
// loads nothing else.

// Reference eval budget: data.max_response_length=30720 (aime_eval.sh), 5 assistant turns.
export const EVAL_MAX_TOKENS = 30720;

/**
 * Sampled evaluation, as `rstar2 eval` runs by default and paper.yaml's held-out eval: avg@16 at temperature 0.6,
 * top-p 0.95. Our choice (`rstar2 eval`'s defaults since it was written): the paper reports average pass@1, but the
 * sampling behind its numbers is not in the release.
 */
export const EVAL_SAMPLED = { samples: 16, temperature: 0.6, topP: 0.95 } as const;

/**
 * The release's own validation (examples/aime_eval.sh): verl's val_kwargs defaults, temperature 0 and top-p 1
 * (greedy), so its val_kwargs.n=16 samples are one answer repeated; one sample gives the same number.
 */
export const EVAL_RELEASE = { samples: 1, temperature: 0, topP: 1 } as const;
