#!/usr/bin/env bash
# GPU checks this repository's CPU machines cannot run (README: "GPU path"): (1) transformers-built Qwen2/Qwen3
# models load into the worker with matching logits and SFT loss, the embedded engine generates as transformers
# does, and model.backend transformers scores and trains a Llama as transformers does, (2) bf16 training
# throughput and MFU of a random ~0.5B model at 4K and 8K tokens, (3) sharding: fsdp, world size 1, through the
# same launcher as DDP.
# Needs CUDA, torch >= 2 (>= 2.2 for step 3) and transformers in $RSTAR2_PYTHON (default python3).
# Run from anywhere: bash bench/gpu-check.sh    Exit: 0 all passed, 1 a check failed, 2 missing prerequisites.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${RSTAR2_PYTHON:-$(command -v python3 || true)}
[ -n "$PY" ] && command -v "$PY" >/dev/null || { echo "gpu-check: no python at '${PY:-python3}'; set RSTAR2_PYTHON" >&2; exit 2; }
command -v node >/dev/null || { echo "gpu-check: node is not on PATH (step 3 runs the TypeScript launcher)" >&2; exit 2; }
node --import tsx -e '' 2>/dev/null || { echo "gpu-check: node cannot load tsx here; run npm ci (step 3 needs it)" >&2; exit 2; }
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" RSTAR2_PYTHON="$PY"
"$PY" -m rstar2_worker.gpu_check preflight
"$PY" -m rstar2_worker.gpu_check parity
"$PY" -m rstar2_worker.gpu_check generate
"$PY" -m rstar2_worker.gpu_check hf-backend
"$PY" -m rstar2_worker.gpu_check throughput
node --import tsx bench/gpu-fsdp.ts
echo "gpu-check: all passed"
