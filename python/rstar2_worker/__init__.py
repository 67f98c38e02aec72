"""rstar2 policy worker: a PyTorch process driven by the TypeScript control plane over stdio."""
PROTOCOL_VERSION = 4  # 2: only rank 0 speaks; it forwards requests to the other ranks. 3: generate calls overlap (the engine).
# 4: train_step requires every option and uses the lr it is sent (warmup is the client's, on the step init/load report)
