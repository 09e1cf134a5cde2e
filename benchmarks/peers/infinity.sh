#!/usr/bin/env bash
# infinity-emb as a served peer, measured by `embedserve bench` as an http:// target.
#
#   DTYPE=float32 benchmarks/peers/infinity.sh MODEL_DIR OUT_DIR [embedserve bench args...]
#
# Pitfalls handled (../shared/PEERS.md): it runs transformers 4.x, which ignores the newer
# `rope_parameters` config format, so a model whose config.json lacks a top-level rope_theta is
# served from a copy with rope_theta written at the top level (weights linked, not copied);
# telemetry off; its OpenAI-style route is /embeddings at the root. It strips leading and
# trailing whitespace: use `--text random` (no edge whitespace) for comparable token counts.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[[ $# -ge 2 ]] || { echo "usage: $0 MODEL_DIR OUT_DIR [embedserve bench args...]" >&2; exit 2; }
MODEL_DIR="$(cd "$1" && pwd)"; OUT="$2"; shift 2
DTYPE="${DTYPE:-float32}"
PORT="${PORT:-7997}"
VENV="${VENV:-$PEER_VENVS/infinity}"

make_venv "$VENV" "infinity-emb[server,torch]==0.0.78"

SERVE_DIR="$MODEL_DIR"
if ! grep -q '"rope_theta"' "$MODEL_DIR/config.json"; then
  SERVE_DIR="$(mktemp -d -t infinity-model-XXXX)"
  for f in "$MODEL_DIR"/*; do ln -s "$f" "$SERVE_DIR/"; done
  rm "$SERVE_DIR/config.json"
  python3 - "$MODEL_DIR/config.json" "$SERVE_DIR/config.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["rope_theta"] = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
json.dump(cfg, open(sys.argv[2], "w"), indent=1)
PY
  log "serving a copy with top-level rope_theta: $SERVE_DIR"
fi

LOG="$(mktemp -t infinity-XXXX.log)"
start_peer "$LOG" env INFINITY_ANONYMOUS_USAGE_STATS=0 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 \
  "$VENV/bin/infinity_emb" v2 --model-id "$SERVE_DIR" --served-model-name peer --engine torch \
  --device cpu --dtype "$DTYPE" --no-bettertransformer --host 127.0.0.1 --port "$PORT"
wait_ready "http://127.0.0.1:$PORT/models" "$LOG"
run_bench "http://127.0.0.1:$PORT?model=peer&pid=$PEER_PID&name=infinity:$DTYPE" "$MODEL_DIR" "$OUT" "$@"
