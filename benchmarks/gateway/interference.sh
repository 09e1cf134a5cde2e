#!/usr/bin/env bash
# Interference through the gateway: the p50/p95 of short online queries while 8K-16K-token
# documents flood at batch priority, side by side:
#   shared    one `embedserve serve` takes both classes (its scheduler favours online work)
#   gateway   `embedserve gateway` with two pools: short (<= 4096 tokens, online) and long
#             (<= 16384, batch + online fallback), one `embedserve serve` each
# Same hardware for both: the shared server gets TOTAL_THREADS torch threads, each pool half.
# Runs `embedserve bench --scenario interference` against both http:// targets.
#
#   benchmarks/gateway/interference.sh [MODELS_DIR] [OUT_DIR] [tiny|h256]
set -euo pipefail
cd "$(dirname "$0")/../.."
MODELS="${1:-/tmp/embedserve-bench-models}"
OUT="${2:-/tmp/embedserve-gateway-interference}"
NAME="${3:-h256}"
PY="${PYTHON:-.venv/bin/python}"
TOTAL_THREADS="${TOTAL_THREADS:-2}"
M="$MODELS/$NAME"
mkdir -p "$OUT"

"$PY" - "$MODELS" <<'PY'
import sys
from pathlib import Path
from tests.helpers.tiny_models import build_decoder

root = Path(sys.argv[1])
if not (root / "tiny" / "config.json").exists():
    build_decoder(root / "tiny", "qwen3")
if not (root / "h256" / "config.json").exists():  # the cpu_baseline.sh shape
    build_decoder(root / "h256", "qwen3", hidden=256, layers=4, heads=4, kv_heads=2,
                  extra={"head_dim": 64, "intermediate_size": 768})
PY

PIDS=()
stop_all() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait || true
}
trap stop_all EXIT INT TERM

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# serve PORT THREADS MAX_MODEL_LEN
serve() {
  OMP_NUM_THREADS="$2" "$PY" -m embedserve serve --model "$M" --port "$1" --max-model-len "$3" \
    --log-level warning >"$OUT/serve-$1.log" 2>&1 &
  PIDS+=("$!")
}

wait_ready() {
  for _ in $(seq 1 600); do
    curl -sf "$1/health/ready" >/dev/null && return 0
    sleep 0.5
  done
  echo "not ready: $1" >&2
  return 1
}

SHARED=$(free_port); SHORT=$(free_port); LONG=$(free_port); GW=$(free_port)
HALF=$(( TOTAL_THREADS > 1 ? TOTAL_THREADS / 2 : 1 ))
serve "$SHARED" "$TOTAL_THREADS" 16384
serve "$SHORT" "$HALF" 4096
serve "$LONG" "$HALF" 16384
cat >"$OUT/pools.yaml" <<YAML
model: $M
pools:
  short: {max_tokens: 4096, upstreams: ["http://127.0.0.1:$SHORT"], classes: [online]}
  long: {max_tokens: 16384, upstreams: ["http://127.0.0.1:$LONG"], classes: [online, batch]}
routes:
  - {class: online, order: [short, long]}
  - {class: batch, order: [long]}
YAML
for p in "$SHARED" "$SHORT" "$LONG"; do wait_ready "http://127.0.0.1:$p"; done
"$PY" -m embedserve gateway --config "$OUT/pools.yaml" --port "$GW" --log-level warning >"$OUT/gateway.log" 2>&1 &
PIDS+=("$!")
wait_ready "http://127.0.0.1:$GW"

"$PY" -m embedserve bench --scenario interference --no-progress --tokenizer "$M/tokenizer.json" \
  --target "http://127.0.0.1:$SHARED/v1?priority=1" --target "http://127.0.0.1:$GW/v1?priority=1" \
  --short-tokens "${SHORT_TOKENS:-32}" --short-requests "${SHORT_REQUESTS:-40}" \
  --short-interval-ms "${SHORT_INTERVAL_MS:-250}" --flood-clients "${FLOOD_CLIENTS:-2}" \
  --flood-min 8192 --flood-max 16384 --cosine-sample 0 --out "$OUT/bench"
curl -s "http://127.0.0.1:$GW/metrics" | grep -E '^embedserve_gateway_(pool_inputs|fallbacks|rejections)_total' \
  >"$OUT/gateway-metrics.txt" || true
echo "report: $OUT/bench/report.md (targets: shared=:$SHARED, gateway=:$GW)"
