#!/usr/bin/env bash
# Issue #10: the GPU benchmark in one call. Run from anywhere on the device machine:
#
#   bash benchmarks/gpu/run.sh                # H200: parity + throughput, ~7.5 min, results in $OUT
#   bash benchmarks/gpu/run.sh --cpu-smoke    # the same flow on CPU with tiny shapes (~1 min)
#   TP_SIZES=1,2,4 TP_MODEL=DIR bash benchmarks/gpu/run.sh   # then tensor parallelism (#24):
#       one 16K input on 1, 2, 4 GPUs (NCCL), bf16, tokens/s + cosine to TP=1 + per-rank weight
#       bytes in $OUT/tp.json (DIR: a model directory, e.g. Qwen3-Embedding-8B, or the random
#       0.6B shape benchmarks/q06.sh writes; needs as many GPUs as the largest size)
#
# Extra arguments go to bench.py (see `python3 benchmarks/gpu/bench.py --help`). Writes
# $OUT/gpu_bench.json (after every phase) and $OUT/summary.txt, and keeps the log in
# $OUT/bench.log. Exit status: 0 ok, 1 parity failed or a phase errored, 2 no GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT="${OUT:-benchmarks/gpu/out}"
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# One process holds a large KV pool and builds/frees several models: avoid fragmentation.
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
# The device image has torch, transformers, tokenizers and safetensors but not embedserve.
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"

"$PY" -c "import torch, transformers, tokenizers, safetensors; print('torch', torch.__version__, \
'cuda', torch.version.cuda, 'gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None, \
'transformers', transformers.__version__)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

# A hard stop inside the device's 10-minute command limit, even if a kernel hangs; the
# bench's own budget (--budget-s, 450 s by default) ends it well before this.
set -o pipefail
timeout --signal=INT --kill-after=15 570 "$PY" benchmarks/gpu/bench.py "$@" 2>&1 | tee "$OUT/bench.log"

# Tensor parallelism (#24), when asked for: after the single-GPU bench, each size in TP_SIZES.
if [[ -n "${TP_SIZES:-}" ]]; then
  timeout --signal=INT --kill-after=15 570 "$PY" benchmarks/tp_bench.py "${TP_MODEL:?TP_MODEL=model directory}" \
    --device cuda --dtype bfloat16 --tp "$TP_SIZES" --length 16384 --budget 8192 --repeats 3 \
    --out "$OUT/tp.json" 2>&1 | tee -a "$OUT/bench.log"
fi
