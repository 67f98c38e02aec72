#!/usr/bin/env bash
# GPU checks this repository's CPU machines cannot run (docs/RESULTS.md: "On GPUs"): (1) transformers-built Qwen2/Qwen3
# models load into the worker with matching logits and SFT loss, the embedded engine generates as transformers
# does, model.backend transformers scores and trains a Llama as transformers does, and the log-prob slices'
# bf16 gradients match full fp32 logits, (2) bf16 training
# throughput and MFU of a random ~0.5B model at 4K and 8K tokens, with `rstar2 plan`'s memory estimate against
# each case's measured peak (and the built-in engine's throughput against transformers' generate), (3) sharding: fsdp, world size 1, through the same launcher as DDP, (4) decode_timing's
# samples (Qwen3-14B's TP4 rank) and their fit, (5) bench/live-engines.sh: rstar2 serve, and SGLang and vLLM where they
# import, each served, probed and trained against with NCCL and disk weight sync, the served weights checked, (6)
# bench/trl-compare.ts on the GPU where trl and datasets import (wheels carried: RSTAR2_GPU_OUT is where its JSON goes).
# Needs CUDA, torch >= 2 (>= 2.2 for step 3) and transformers in $RSTAR2_PYTHON (default: the project venv, .venv).
# Run from anywhere: bash bench/gpu-check.sh    Exit: 0 all passed, 1 a check failed, 2 missing prerequisites.
# RSTAR2_GPU_CHECK_SKIP=train-bench leaves out the train step's benchmark (run alone: python python/bench/train_bench.py).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RSTAR2_VENV:-.venv}
PY=${RSTAR2_PYTHON:-$( [ -x "$VENV/bin/python" ] && echo "$VENV/bin/python" || command -v python3 || true)}
[ -n "$PY" ] && command -v "$PY" >/dev/null || { echo "gpu-check: no python at '${PY:-python3}'; set RSTAR2_PYTHON" >&2; exit 2; }
command -v node >/dev/null || { echo "gpu-check: node is not on PATH (steps 2 and 3 run TypeScript)" >&2; exit 2; }
node --import tsx -e '' 2>/dev/null || { echo "gpu-check: node cannot load tsx here; run npm ci (steps 2 and 3 need it)" >&2; exit 2; }
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" RSTAR2_PYTHON="$PY"
"$PY" python/bench/gpu_check.py preflight
"$PY" python/bench/gpu_check.py parity
"$PY" python/bench/gpu_check.py generate
# the built-in engine against transformers' generate on the same weights, and a multi-turn rollout's prefix reuse
"$PY" python/bench/engine_bench.py
"$PY" python/bench/gpu_check.py hf-backend
"$PY" python/bench/gpu_check.py logprob-grad
"$PY" python/bench/gpu_check.py compiled
PEAKS=$(mktemp); trap 'rm -f "$PEAKS"' EXIT
RSTAR2_GPU_PEAKS="$PEAKS" "$PY" python/bench/gpu_check.py throughput
node --import tsx bench/gpu-plan.ts "$PEAKS"
# the train step against the plain transformers loop (issue 41's targets), 0.5B and 3B shapes
case ",${RSTAR2_GPU_CHECK_SKIP:-}," in *,train-bench,*) echo "gpu-check: train-bench skipped (RSTAR2_GPU_CHECK_SKIP)" ;;
  *) "$PY" python/bench/train_bench.py ;; esac
node --import tsx bench/gpu-fsdp.ts
# (4) the engine time model's tool: Qwen3-14B's TP4 rank, a few points, fitted as scheduler-sim --calibrate fits them
SAMPLES=$(mktemp); trap 'rm -f "$PEAKS" "$SAMPLES"' EXIT
"$PY" python/bench/decode_timing.py --tp 4 --kv-tokens 131072 --batches 64,128,256 --contexts 256,512 \
  --prefills 256,1024,4096 --out "$SAMPLES"
node --import tsx -e "
  import { readFileSync } from 'node:fs';
  import { fitEngineModel, parseSamples } from './src/engines/calibrate.ts';
  const { steps, prefills } = parseSamples(readFileSync(process.argv[1], 'utf8'));
  console.log('gpu-check: decode_timing fit', JSON.stringify(fitEngineModel(steps, prefills)));
" "$SAMPLES"
# (5) live SGLang / vLLM servers and rstar2's own (rstar2 serve, which needs neither); its exit 2 is "nothing to check"
live=0
LIVE_ENGINES=${LIVE_ENGINES:-sglang vllm rstar2} bash bench/live-engines.sh || live=$?
if [ "$live" = 2 ]; then echo "gpu-check: live engines skipped: neither sglang nor vllm imports in $PY"
elif [ "$live" != 0 ]; then echo "gpu-check: live engines failed (bench/live-engines.sh exit $live)" >&2; exit 1; fi
# (6) rstar2's RL step against TRL's GRPOTrainer on the GPU (issue 55), Qwen2.5-0.5B's shape, where trl imports
if "$PY" -c 'import trl, datasets' 2>/dev/null; then
  node --import tsx bench/trl-compare.ts --device cuda --shape 0.5b --use-installed --rounds 1 --steps 3 \
    --work "${TMPDIR:-/tmp}/rstar2-trl-compare-gpu" --out "${RSTAR2_GPU_OUT:-${TMPDIR:-/tmp}}/trl-compare-gpu.json"
else echo "gpu-check: trl-compare skipped: trl or datasets does not import in $PY (carry the wheels of trl 1.13.0, datasets 5.0.1, dill and multiprocess: the rest is in the CUDA image)"; fi
echo "gpu-check: all passed"
