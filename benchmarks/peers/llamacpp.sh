#!/usr/bin/env bash
# llama.cpp (PyPI llama-cpp-python) as a served peer, measured by `embedserve bench`.
#
#   benchmarks/peers/llamacpp.sh FILE.gguf TOKENIZER_DIR OUT_DIR [embedserve bench args...]
#
# TOKENIZER_DIR is a Hugging Face directory of the same model (its tokenizer.json defines the
# input lengths). The wheel compiles for ~7 minutes on 2 cores (GGML_NATIVE=ON). Served by
# llamacpp_server.py beside this script, because llama-cpp-python's own server cannot set the
# pooling type. Memory reached ~6.9 GB at 8K tokens in PEERS.md's test.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[[ $# -ge 3 ]] || { echo "usage: $0 FILE.gguf TOKENIZER_DIR OUT_DIR [embedserve bench args...]" >&2; exit 2; }
GGUF="$(realpath "$1")"; TOKENIZER_DIR="$(cd "$2" && pwd)"; OUT="$3"; shift 3
PORT="${PORT:-8012}"
VENV="${VENV:-$PEER_VENVS/llamacpp}"
POOLING="${POOLING:-last}"
N_CTX="${N_CTX:-16384}"

CMAKE_ARGS="-DGGML_NATIVE=ON" make_venv "$VENV" llama-cpp-python==0.3.36

LOG="$(mktemp -t llamacpp-XXXX.log)"
start_peer "$LOG" "$VENV/bin/python" "$(dirname "$0")/llamacpp_server.py" --model "$GGUF" --port "$PORT" \
  --pooling "$POOLING" --n-ctx "$N_CTX" --threads "$(nproc)"
wait_ready "http://127.0.0.1:$PORT/v1/models" "$LOG"
run_bench "http://127.0.0.1:$PORT/v1?model=peer&pid=$PEER_PID&name=llama.cpp" "$TOKENIZER_DIR" "$OUT" "$@"
