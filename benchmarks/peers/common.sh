#!/usr/bin/env bash
# Shared steps of the peer scripts: own venv, start on loopback, wait until ready, run the
# bench matrix against it as an http:// target, always stop it. Sourced, not run.
#
# Environment: EMBEDSERVE (the project's embedserve command, default .venv/bin/embedserve
# from the repo root), PEER_VENVS (where peer venvs live, default ~/.cache/embedserve-peers:
# outside the work tree, they are GBs), VENV (one peer's venv), READY_TIMEOUT (seconds,
# default 900), PORT (per peer default).

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
EMBEDSERVE="${EMBEDSERVE:-$REPO_ROOT/.venv/bin/embedserve}"
PEER_VENVS="${PEER_VENVS:-$HOME/.cache/embedserve-peers}"
READY_TIMEOUT="${READY_TIMEOUT:-900}"
PEER_PID=""
PEER_PIDS=()

log() { echo "[peer] $*" >&2; }

# make_venv DIR PIP_ARGS...: create DIR once and install the peer into it (never the project's venv).
make_venv() {
  local dir="$1"; shift
  if [[ -x "$dir/bin/python" ]]; then
    log "reusing $dir"
    return
  fi
  log "creating $dir"
  mkdir -p "$(dirname "$dir")"
  python3 -m venv "$dir"
  "$dir/bin/pip" install -q --disable-pip-version-check torch==2.13.0
  "$dir/bin/pip" install -q --disable-pip-version-check "$@"
}

# start_peer LOGFILE CMD...: start in its own session so the whole process tree can be stopped;
# sets PEER_PID. Every peer started is stopped when the calling script exits.
start_peer() {
  local logfile="$1"; shift
  setsid "$@" >"$logfile" 2>&1 &
  PEER_PID=$!
  PEER_PIDS+=("$PEER_PID")
  trap stop_peers EXIT INT TERM
  log "started pid $PEER_PID, log $logfile"
}

stop_peers() {
  local pid
  for pid in "${PEER_PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null || continue
    log "stopping pid $pid"
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 30); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
  PEER_PIDS=()
}

# wait_ready URL LOGFILE [PID]: poll until URL answers 200; fail early if the peer died.
wait_ready() {
  local url="$1" logfile="$2" pid="${3:-$PEER_PID}" waited=0
  until curl -sf -o /dev/null "$url"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "peer exited before it was ready; last lines of $logfile:"
      tail -n 30 "$logfile" >&2
      return 1
    fi
    if (( waited >= READY_TIMEOUT )); then
      log "not ready after ${READY_TIMEOUT}s"
      return 1
    fi
    sleep 2
    waited=$((waited + 2))
  done
  log "ready after ~${waited}s: $url"
}

# run_bench TARGET TOKENIZER OUT BENCH_ARGS...: the caller's targets first (ratios are to the
# first target), then the peer.
run_bench() {
  local target="$1" tokenizer="$2" out="$3"; shift 3
  "$EMBEDSERVE" bench "$@" --target "$target" --tokenizer "$tokenizer" --out "$out"
}
