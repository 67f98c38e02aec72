// Eval defaults the CLI shows in --help, apart from the modules that use them so that registering the command
// loads nothing else.

// Reference eval budget: data.max_response_length=30720 (aime_eval.sh), 5 assistant turns.
export const EVAL_MAX_TOKENS = 30720;
