"""rstar2 policy worker: a PyTorch process driven by the TypeScript control plane over stdio."""
PROTOCOL_VERSION = 1
