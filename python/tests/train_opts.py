"""The full option set Policy.train_step requires, for the Python callers that are not the client: tests and
benches (`from tests.train_opts import full_train_opts`, with python/ on the path). The values are
TrainOptionsSchema's defaults (src/worker/types.ts), which the worker itself does not know; test/worker/
train-keys.test.ts holds them equal. No torch import: that test runs this module alone."""

DEFAULTS = {
    "weightDecay": 0.01,
    "betas": [0.9, 0.999],
    "eps": 1e-8,
    "gradClip": 1.0,
    "clipLow": 0.2,
    "clipHigh": 0.28,
    "dualClip": 3.0,
    "microBatchTokens": 8192,
    "maxTokensPerMicroBatch": None,
    "gradientCheckpointing": False,
    "logitsChunkTokens": None,
    "lossAgg": "token-mean",
    "nominalSeqs": None,
    "klCoef": 0,
    "klEstimator": "k3",
    "refLogprobs": None,
    "entropyCoef": 0,
}


def full_train_opts(lr, **overrides):
    """Every train_step option: lr (the schema has no default for it), the schema's defaults, then `overrides`."""
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"full_train_opts: unknown options: {', '.join(unknown)}")
    return {"lr": lr, **DEFAULTS, **overrides}
