"""rstar2 policy worker: a PyTorch process driven by the TypeScript control plane over stdio."""
PROTOCOL_VERSION = 3  # 2: only rank 0 speaks; it forwards requests to the other ranks. 3: generate calls overlap (the engine)
