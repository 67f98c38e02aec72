#!/usr/bin/env bash
# Live SGLang and vLLM (docs/ENGINES.md: "SGLang and vLLM"; issue 40), and rstar2's own server (`rstar2 serve`,
# LIVE_ENGINES=rstar2; issue 52). For each of SGLang and vLLM that imports in $RSTAR2_PYTHON, and rstar2 when named:
# a tiny Qwen3 model directory (`rstar2 model init`) served on 127.0.0.1 as rstar2 needs it served, then
# (a) bench/engine-probe.ts: what the server says of itself (version, bfloat16, logprobs mode, seeds, whether it
#     can join a weight-update group) and a few timed points,
# (b) a 2-step RL run of the tiny-files recipe on it with --weight-sync nccl: weights broadcast at least twice, the
#     second after an update, no fallback to disk, no failed sample in the steps or evals after it,
# (c) the same run with --weight-sync disk: the sync directory the server reloads from replaced, the run clean,
# and after each run (bench/served-weights.ts) the served log-probs of a fixed prompt are the run's last checkpoint's.
# With >= 2 GPUs the server takes the last, the trainer the first. With none (rstar2 serve on a CPU) the trainer is
# on the CPU too and broadcasts over gloo, which (b) must then do. On one GPU NCCL refuses two ranks of one
# communicator on one device of one host, so the trainer and the server claim different hosts (NCCL_HOSTID) and
# talk over NCCL's network transport, as two nodes would; where that still falls back to disk, (b) says SKIP.
# At the end, per engine, which steps ran and how each ended.
# Env: RSTAR2_PYTHON (default python3), LIVE_ENGINES ("sglang vllm"; add rstar2), LIVE_START_TIMEOUT (600 s for a server to
# answer /health), LIVE_RUN_TIMEOUT (900 s a run), LIVE_MEM_FRACTION (0.15 of the GPU for the server),
# RSTAR2_SGLANG_ARGS / RSTAR2_VLLM_ARGS (more server flags), LIVE_KEEP=1 (keep the work directory).
# Run from anywhere: bash bench/live-engines.sh    Exit: 0 all passed, 1 a check failed, 2 nothing to check.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${RSTAR2_PYTHON:-$(command -v python3 || true)}
if [ -z "$PY" ] || ! command -v "$PY" >/dev/null; then echo "live-engines: no python at '${PY:-python3}'; set RSTAR2_PYTHON" >&2; exit 2; fi
command -v node >/dev/null || { echo "live-engines: node is not on PATH" >&2; exit 2; }
[ -d node_modules/tsx ] || { echo "live-engines: node_modules is missing: run npm ci (or npm install) first" >&2; exit 2; }
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" RSTAR2_PYTHON="$PY"

ENGINES=()
for e in ${LIVE_ENGINES:-sglang vllm}; do
  if [ "$e" = rstar2 ]; then ENGINES+=(rstar2) # this checkout's own server: nothing to import
  elif "$PY" -c "import $e" >/dev/null 2>&1; then ENGINES+=("$e"); else echo "live-engines: $e does not import in $PY: skipped"; fi
done
[ ${#ENGINES[@]} -gt 0 ] || { echo "live-engines: neither sglang nor vllm imports in $PY: nothing to check" >&2; exit 2; }

START_TIMEOUT=${LIVE_START_TIMEOUT:-600}
RUN_TIMEOUT=${LIVE_RUN_TIMEOUT:-900}
MEM=${LIVE_MEM_FRACTION:-0.15}
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then IFS=, read -ra GPUS <<<"$CUDA_VISIBLE_DEVICES" # set and empty: none
else mapfile -t GPUS < <(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null); fi
ENGINE_ENV=() TRAIN_ENV=()
if [ ${#GPUS[@]} -ge 2 ]; then ENGINE_ENV=("CUDA_VISIBLE_DEVICES=${GPUS[-1]}") TRAIN_ENV=("CUDA_VISIBLE_DEVICES=${GPUS[0]}")
elif [ ${#GPUS[@]} -eq 1 ]; then ENGINE_ENV=("NCCL_HOSTID=rstar2-live-server") TRAIN_ENV=("NCCL_HOSTID=rstar2-live-trainer")
fi
declare -A STEPS=() # engine -> what ran and how it ended

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rstar2-live-XXXXXX")
FAILED=() SERVER=
stop_server() {
  [ -n "$SERVER" ] || return 0
  kill -TERM -- "-$SERVER" 2>/dev/null || kill -TERM "$SERVER" 2>/dev/null # its group: SGLang and vLLM fork
  for _ in $(seq 30); do kill -0 -- "-$SERVER" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$SERVER" 2>/dev/null
  wait "$SERVER" 2>/dev/null
  SERVER=
}
finish() {
  stop_server
  if [ ${#FAILED[@]} -gt 0 ] || [ -n "${LIVE_KEEP:-}" ]; then echo "live-engines: logs and runs in $WORK"; else rm -rf "$WORK"; fi
}
trap finish EXIT
trap 'exit 130' INT TERM

# ENGINE WHAT PASS|FAIL|SKIP [DETAIL [LOG]]: the verdict's line, and on a failure the log's tail
verdict() {
  echo "live-engines: $1 $2: $3${4:+ ($4)}"
  STEPS[$1]="${STEPS[$1]:+${STEPS[$1]}, }$2 $3"
  if [ "$3" = FAIL ]; then
    FAILED+=("$1 $2")
    [ -n "${5:-}" ] && [ -f "$5" ] && tail -n 20 "$5" | sed 's/^/    /'
  fi
  return 0
}

free_port() {
  node -e "const s = require('node:net').createServer().listen(0, '127.0.0.1', () => { console.log(s.address().port); s.close(); })"
}

# ENGINE DIR PORT LOG: the server in its own process group, serving DIR as rstar2 needs (docs/ENGINES.md, src/engines/)
start_server() {
  local -a cmd
  if [ "$1" = rstar2 ]; then
    # the built-in engine's pool takes its share of the GPU as the servers' do (RSTAR2_KV_FRACTION)
    # shellcheck disable=SC2206
    cmd=(RSTAR2_KV_FRACTION="$MEM" node bin/rstar2.js serve --model "$2" --host 127.0.0.1 --port "$3"
      ${RSTAR2_SERVE_ARGS:-})
  elif [ "$1" = sglang ]; then
    # --dtype bfloat16: under auto SGLang serves a float32 checkpoint (this one) in float16, and the trainer sends
    # bfloat16; triton attention takes the model's 16-wide heads and is one of the deterministic backends
    # shellcheck disable=SC2206 # the extra flags are words
    cmd=("$PY" -m sglang.launch_server --model-path "$2" --host 127.0.0.1 --port "$3" --dtype bfloat16
      --mem-fraction-static "$MEM" --enable-deterministic-inference --attention-backend triton --disable-cuda-graph
      ${RSTAR2_SGLANG_ARGS:-})
  else
    # shellcheck disable=SC2206
    cmd=(VLLM_SERVER_DEV_MODE=1 "$PY" -m vllm.entrypoints.openai.api_server --model "$2" --host 127.0.0.1 --port "$3"
      --dtype bfloat16 --gpu-memory-utilization "$MEM" --logprobs-mode processed_logprobs
      --worker-extension-cls rstar2_worker.vllm_ext.WeightSyncExtension --enforce-eager ${RSTAR2_VLLM_ARGS:-})
  fi
  setsid env "${ENGINE_ENV[@]}" "${cmd[@]}" >"$4" 2>&1 &
  SERVER=$!
}

# URL: until its /health answers 200; false when the server exits first or START_TIMEOUT passes
wait_ready() {
  local deadline=$((SECONDS + START_TIMEOUT))
  while [ $SECONDS -lt $deadline ]; do
    kill -0 "$SERVER" 2>/dev/null || return 1
    node -e 'fetch(process.argv[1]).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))' "$1/health" && return 0
    sleep 2
  done
  return 1
}

# ENGINE URL MODE DIR: a 2-step RL run of tiny-files on the served model, weights synced by MODE through DIR/serve
train() {
  timeout -k 30 "$RUN_TIMEOUT" env "${TRAIN_ENV[@]}" node bin/rstar2.js train --recipe tiny-files --stages rl \
    --set "model.path=$WORK/model" --set stages.rl.steps=2 --set "reward.module=$WORK/coin.mjs" \
    --engines "$1+$2" --weight-sync "$3" --sync-dir "$4/serve" --out "$4/run-$3" >"$4/run-$3.log" 2>&1
}

# ENGINE MODE RC DIR: the run's verdict from its exit, metrics.jsonl, evals.jsonl and log
check_run() {
  local run=$4/run-$2 log=$4/run-$2.log bad=() steps sent fell
  [ "$3" = 0 ] || bad+=("exit $3")
  steps=$(grep -c '"stage":"rl"' "$run/metrics.jsonl" 2>/dev/null)
  [ "$steps" = 2 ] || bad+=("${steps:-0} RL steps logged, not 2")
  grep -q '"loss"' "$run/metrics.jsonl" 2>/dev/null || bad+=("no step updated the weights")
  grep -q '"failed"' "$run/metrics.jsonl" "$run/evals.jsonl" 2>/dev/null && bad+=("failed samples in metrics or evals")
  sent=$(grep -c 'weight sync v[0-9]*: broadcast' "$log")
  fell=$(grep -m1 'syncing through disk from now on' "$log")
  if [ "$2" = disk ]; then
    [ "$sent" = 0 ] || bad+=("$sent broadcasts under --weight-sync disk")
    [ ! -e "$4/serve/.live-engines" ] || bad+=("the sync directory was never replaced")
  elif [ -z "$fell" ] && [ "$sent" -lt 2 ]; then bad+=("$sent broadcasts, not >= 2")
  elif [ -n "$fell" ] && [ ${#GPUS[@]} != 1 ]; then bad+=("fell back to disk: $fell")
  fi
  if [ ${#bad[@]} -gt 0 ]; then verdict "$1" "$2" FAIL "$(IFS=';'; echo "${bad[*]}")" "$log"
  elif [ -n "$fell" ]; then
    verdict "$1" "$2" SKIP "${#GPUS[@]} GPU(s)$([ ${#GPUS[@]} = 1 ] && echo ', NCCL refused both ranks on it as two hosts (NCCL_HOSTID)'): fell back to disk and passed: $fell"
  elif [ "$2" = nccl ]; then
    # NCCL from a GPU trainer, gloo from a CPU one (no GPU seen): the group's backend as the run joined it
    local backend
    backend=$(grep -m1 -o 'weight sync: joined [^ ]* ([a-z]*' "$log" | sed 's/.*(//')
    verdict "$1" "$2" PASS "$sent broadcasts over ${backend:-?}; $(grep -m2 'weight sync v[0-9]*: broadcast' "$log" | tail -n1)"
  else verdict "$1" "$2" PASS "synced through $4/serve"
  fi
}

# ENGINE API URL MODE DIR: the served log-probs of a fixed prompt are those of the run's last checkpoint
weights() {
  local log=$5/weights-$4.log line
  if [ "${LIVE_WEIGHTS:-1}" = 0 ]; then verdict "$1" "weights-$4" SKIP "LIVE_WEIGHTS=0"; return; fi
  [ -d "$5/run-$4/checkpoints" ] || { verdict "$1" "weights-$4" FAIL "the run left no checkpoint"; return; }
  # rstar2 serves float32 as trained: its log-probs are the trainer's to rounding; the servers' bfloat16 is not
  env "${TRAIN_ENV[@]}" node --import tsx bench/served-weights.ts --engine "$2+$3" --run "$5/run-$4" \
    --tolerance "$([ "$1" = rstar2 ] && echo 1e-3 || echo 0.05)" >"$log" 2>&1
  local rc=$?
  line=$(grep -m1 '^served-weights:' "$log")
  if [ "$rc" = 0 ]; then verdict "$1" "weights-$4" PASS "$line"; else verdict "$1" "weights-$4" FAIL "${line:-exit $rc}" "$log"; fi
}

check_engine() {
  local e=$1 dir=$WORK/$1 port url rc probe api=$1
  [ "$e" = rstar2 ] && api=sglang # rstar2 serve speaks SGLang's API
  if ! { mkdir -p "$dir" && cp -r "$WORK/model" "$dir/serve"; }; then verdict "$e" setup FAIL "cannot copy the model"; return; fi
  port=$(free_port) url=http://127.0.0.1:$port
  echo "live-engines: $e: starting on $url${ENGINE_ENV[0]:+ (${ENGINE_ENV[0]})}"
  start_server "$e" "$dir/serve" "$port" "$dir/server.log"
  if ! wait_ready "$url"; then
    verdict "$e" server FAIL "no 200 from $url/health within ${START_TIMEOUT}s, or the server exited" "$dir/server.log"
    stop_server
    return
  fi
  node --import tsx bench/engine-probe.ts --engine "$api+$url" --model "$WORK/model" --batches 1,8 --contexts 64,256 \
    --prefills 64,256,1024 --steps 8,24 --reps 2 --out "$dir/probe.jsonl" >"$dir/probe.log" 2>&1
  rc=$? probe=$(grep -m1 "^engine $api:" "$dir/probe.log")
  local want=('weight sync: broadcast')
  case $e in
    sglang) want+=('dtype bfloat16' 'seeds honoured') ;;
    vllm) want+=('dtype bfloat16' 'logprobs processed_logprobs') ;;
    rstar2) want+=('dtype float32' 'seeds honoured') ;; # it serves the checkpoint's float32 as it is
  esac
  local missing=() w
  for w in "${want[@]}"; do grep -q "$w" "$dir/probe.log" || missing+=("$w"); done
  if [ "$rc" != 0 ] || [ ${#missing[@]} -gt 0 ]; then
    verdict "$e" probe FAIL "exit $rc${missing[0]:+; missing: $(IFS=,; echo "${missing[*]}")}" "$dir/probe.log"
  else verdict "$e" probe PASS "$probe"; fi
  train "$api" "$url" nccl "$dir"
  check_run "$e" nccl $? "$dir"
  weights "$e" "$api" "$url" nccl "$dir"
  touch "$dir/serve/.live-engines" # gone once a disk sync swaps the directory in whole
  train "$api" "$url" disk "$dir"
  check_run "$e" disk $? "$dir"
  weights "$e" "$api" "$url" disk "$dir"
  stop_server
}

echo "live-engines: ${#GPUS[@]} GPU(s) seen; work directory $WORK"
if ! node bin/rstar2.js model init --config tiny-qwen3 --tokenizer qwen3 --out "$WORK/model" >"$WORK/model-init.log" 2>&1; then
  verdict model init FAIL "rstar2 model init --config tiny-qwen3 --tokenizer qwen3" "$WORK/model-init.log"
  exit 1
fi
# the served model is random, so every sample would score 0 and every group of equal rewards be skipped (no update):
# this reward splits groups by the parity of a sample's text instead
echo 'export default ({ text }) => [...text].reduce((a, c) => a + c.codePointAt(0), 0) % 2;' >"$WORK/coin.mjs"
for e in "${ENGINES[@]}"; do check_engine "$e"; done
for e in "${ENGINES[@]}"; do echo "live-engines: $e ran: ${STEPS[$e]:-nothing}"; done
if [ ${#FAILED[@]} -gt 0 ]; then echo "live-engines: FAILED: $(IFS=,; echo "${FAILED[*]}")"; exit 1; fi
echo "live-engines: all passed (${ENGINES[*]})"
