"""Causal attention for one sequence as tiled bf16 matmuls (the CPU bf16 route for chunks under
the native kernel's NATIVE_MIN_ROWS, or where that kernel did not build).

PyTorch's CPU flash kernel runs bf16 at its float32 speed, far below what a bf16 matmul
reaches. This route instead spends the FLOPs in oneDNN's bf16 matmuls, per KV head and per
tile of query rows:

    scores = q_tile @ K_h^T      [groups * rows, keys]   bf16 out, fp32 accumulation
    mask the tile's own upper triangle (keys after each query), softmax (fp32 inside)
    out    = probs @ V_h         [groups * rows, head_dim]

Grouped-query attention needs no expanded K/V: the query heads that share KV head h are
rows of one matmul against it. Plain 2-D matmuls over the first `end` keys read K_h and V_h
in place (a batched matmul copied those strided slices for every tile and fragmented the
heap). Tiles of 256 query rows measured fastest at 2K-16K keys; every large buffer is kept
per thread and reused. Measurements: docs/performance.md ("bf16 attention as tiled bf16
matmuls", "Kept buffers in the attention loop").

Numerics: scores are rounded to bf16 before the softmax, which flash keeps in fp32; the
attention output's error vs float64 stays close to flash's, and end-to-end parity is tested
(`tests/unit/attention/test_gemm_attention.py`, `tests/unit/engine/test_engine_bf16.py`).
"""

from __future__ import annotations

import threading

import torch

TILE_ROWS = 256  # query rows per tile and head group
TILE_ELEMENTS = 1 << 24  # cap on one score tile (groups x rows x keys)
MIN_TILE_ROWS = 16

_local = threading.local()  # per engine thread: concurrent engines never share a buffer


def _workspace(name: str, numel: int, like: torch.Tensor) -> torch.Tensor:
    """A kept flat buffer of at least `numel` elements (grown to a power of two).

    Fresh multi-MB tensors per tile cost more than the matmul (page faults). A buffer made
    under `torch.inference_mode` is an inference tensor that cannot be written outside it, so
    a thread that runs both ways keeps one of each.
    """
    cache: dict[tuple[str, torch.dtype, torch.device, bool], torch.Tensor] = _local.__dict__.setdefault(
        "bufs", {}
    )
    key = (name, like.dtype, like.device, torch.is_inference_mode_enabled())
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = cache[key] = torch.empty(1 << (numel - 1).bit_length(), dtype=like.dtype, device=like.device)
    return buf[:numel]


def tile_rows(groups: int, num_keys: int) -> int:
    rows = min(TILE_ROWS, TILE_ELEMENTS // max(1, groups * num_keys))
    return max(MIN_TILE_ROWS, rows)


def _dense_heads(name: str, x: torch.Tensor) -> torch.Tensor:
    """x [heads, n, d] itself when each head's [n, d] is one dense block (read in place),
    else a copy in the kept buffer `name`."""
    if x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return _workspace(name, x.numel(), x).view(x.shape).copy_(x)


def gemm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [n, heads, d] at prompt positions kv-n .. kv-1; k, v: [kv_heads, kv, d], every key
    up to the last query. Query i sees keys 0 .. kv-n+i. Returns [n, heads * d] in q's dtype.
    K/V already dense per head (the layer-major lane's buffer) are read in place; others are
    copied once per call into kept buffers.
    """
    n, heads, d = q.shape
    kv_heads, kv, _ = k.shape
    groups = heads // kv_heads
    start = kv - n
    # [kv_heads, n, groups, d]: query head h*groups+g uses KV head h (repeat_interleave order)
    qg = (q * scale).view(n, kv_heads, groups, d).transpose(0, 1)
    k_h, v_h = _dense_heads("k", k), _dense_heads("v", v)
    out = torch.empty(n, kv_heads, groups, d, dtype=q.dtype, device=q.device)
    step = min(n, tile_rows(groups, kv))
    scores_buf = _workspace("scores", step * groups * kv, q)
    probs_buf = _workspace("probs", step * groups * kv, q)
    upper = torch.ones(step, step, dtype=torch.bool, device=q.device).triu(1).unsqueeze(1)  # [row, 1, key]
    for h in range(kv_heads):
        q_rows = qg[h].reshape(n * groups, d)  # row i * groups + g
        for i0 in range(0, n, step):
            i1 = min(n, i0 + step)
            rows, end = i1 - i0, start + i1  # keys past `end` are after every query of the tile
            size = rows * groups * end
            scores = scores_buf[:size].view(rows * groups, end)
            torch.mm(q_rows[i0 * groups : i1 * groups], k_h[h, :end].t(), out=scores)
            own = scores.view(rows, groups, end)[:, :, start + i0 : end]
            own.masked_fill_(upper[:rows, :, :rows], float("-inf"))
            probs = probs_buf[:size].view(rows * groups, end)
            torch.ops.aten._softmax.out(scores, -1, False, out=probs)
            out[i0:i1, h] = torch.mm(probs, v_h[h, :end]).view(rows, groups, d)
    return out.view(n, heads * d)
