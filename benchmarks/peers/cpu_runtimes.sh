#!/usr/bin/env bash
# The CPU runtimes users pick beside embedserve (#64): makes each peer's venv once (outside the
# work tree: PEER_VENVS, default ~/.cache/embedserve-peers; the recipes of PEERS.md), then runs
# benchmarks/peers/cpu_runtimes.py with the project's python (PYTHON, default .venv's). Extra
# arguments go to it (--model DIR, --inputs, --tokens, --rounds, --runtimes, --gguf FILE: then
# llama.cpp runs too, its venv made once: llama-cpp-python compiles for ~7 minutes).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-$REPO_ROOT/.venv/bin/python}"
PEER_VENVS="${PEER_VENVS:-$HOME/.cache/embedserve-peers}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

make_peer() {  # make DIR PIP_ARGS...: once; torch first (the CPU build), never the project's venv
  local dir="$1"; shift
  [[ -x "$dir/bin/python" ]] && return
  python3 -m venv "$dir"
  "$dir/bin/pip" install -q torch==2.13.0
  "$dir/bin/pip" install -q torch==2.13.0 "$@"
}

# ONNX Runtime through sentence-transformers: optimum-onnx needs transformers < 4.58.
make_peer "$PEER_VENVS/onnx" "sentence-transformers==5.7.0" "transformers>=4.57,<4.58" "optimum-onnx[onnxruntime]==0.1.0"
# OpenVINO: plain [openvino] pulls a CUDA torch through torchvision, so pin torchvision, then drop it.
if [[ ! -x "$PEER_VENVS/openvino/bin/python" ]]; then
  make_peer "$PEER_VENVS/openvino" torchvision==0.28.0 "sentence-transformers[openvino]==6.3.0"
  "$PEER_VENVS/openvino/bin/pip" uninstall -q -y torchvision
  "$PEER_VENVS/openvino/bin/pip" install -q "huggingface-hub>=1.5.0,<1.22" datasets
fi
# fastembed: ONNX Runtime without torch.
if [[ ! -x "$PEER_VENVS/fastembed/bin/python" ]]; then
  python3 -m venv "$PEER_VENVS/fastembed"
  "$PEER_VENVS/fastembed/bin/pip" install -q fastembed
fi

LLAMACPP=()
if [[ " $* " == *" --gguf "* ]]; then
  if [[ ! -x "$PEER_VENVS/llamacpp/bin/python" ]]; then
    python3 -m venv "$PEER_VENVS/llamacpp"
    CMAKE_ARGS="-DGGML_NATIVE=ON" "$PEER_VENVS/llamacpp/bin/pip" install -q llama-cpp-python==0.3.36 numpy
  fi
  LLAMACPP=(--llamacpp "$PEER_VENVS/llamacpp")
fi

exec "$PYTHON" "$REPO_ROOT/benchmarks/peers/cpu_runtimes.py" --onnx "$PEER_VENVS/onnx" \
  --openvino "$PEER_VENVS/openvino" --fastembed "$PEER_VENVS/fastembed" "${LLAMACPP[@]}" "$@"
