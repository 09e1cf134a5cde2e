"""The tiled-matmul attention route equals causal softmax attention over the same keys."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention

from embedserve.attention import cpu as attention
from embedserve.attention import cpu_gemm as gemm_attention
from embedserve.attention.cpu import CpuRoute, paged_attention
from embedserve.attention.metadata import AttentionMetadata, SeqSpan


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """float64 masked attention; query i of n sits at position kv - n + i."""
    n, kv, groups = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    mask = torch.arange(kv)[None, :] <= torch.arange(kv - n, kv)[:, None]
    return (
        scaled_dot_product_attention(
            q.double().transpose(0, 1)[None],
            k.double().repeat_interleave(groups, 1).transpose(0, 1)[None],
            v.double().repeat_interleave(groups, 1).transpose(0, 1)[None],
            attn_mask=mask,
            scale=scale,
        )[0]
        .transpose(0, 1)
        .flatten(1)
    )


def _qkv(n: int, kv: int, heads: int, kv_heads: int, d: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, heads, d, generator=gen),
        torch.randn(kv, kv_heads, d, generator=gen) + 0.5,  # a shared key direction: larger logits
        torch.randn(kv, kv_heads, d, generator=gen),
    )


def _head_major(x: torch.Tensor, dense: bool) -> torch.Tensor:
    """[kv, kv_heads, d] -> [kv_heads, kv, d]: the first rows of a longer head-major buffer,
    as the layer-major lane keeps K/V (read in place), or a strided view (copied)."""
    if not dense:
        return x.transpose(0, 1)
    buf = torch.full((x.shape[1], x.shape[0] + 7, x.shape[2]), float("nan"), dtype=x.dtype)
    buf[:, : x.shape[0]] = x.transpose(0, 1)
    return buf[:, : x.shape[0]]


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (8, 2), (9, 3)])
@pytest.mark.parametrize(("start", "n"), [(0, 1), (0, 70), (37, 1), (37, 70), (200, 33)])
def test_equals_float64_causal_attention(
    monkeypatch: pytest.MonkeyPatch, heads: int, kv_heads: int, start: int, n: int, dense: bool
) -> None:
    # tiles of 16 rows: a 70-row chunk spans five tiles, the last one partial
    monkeypatch.setattr(gemm_attention, "TILE_ROWS", 16)
    q, k, v = _qkv(n, start + n, heads, kv_heads, 16, seed=start + n + heads)
    buffers: list[str] = []
    workspace = gemm_attention._workspace
    monkeypatch.setattr(
        gemm_attention, "_workspace", lambda name, *a: buffers.append(name) or workspace(name, *a)
    )
    got = gemm_attention.gemm_attention(q, _head_major(k, dense), _head_major(v, dense), scale=0.4)
    assert ("k" in buffers, "v" in buffers) == (not dense, not dense)  # dense heads: no copy
    want = _reference(q, k, v, 0.4)
    assert got.shape == (n, heads * 16)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_bf16_within_bf16_rounding_of_float64() -> None:
    q, k, v = _qkv(300, 700, 8, 2, 64, seed=3)
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    got = gemm_attention.gemm_attention(q, _head_major(k, True), _head_major(v, False), scale=64**-0.5)
    want = _reference(q, k, v, 64**-0.5)
    assert got.dtype == torch.bfloat16
    rel = ((got.double() - want).norm() / want.norm()).item()
    assert rel < 1e-2, rel
    cos = torch.nn.functional.cosine_similarity(got.double(), want)
    assert cos.min() > 0.999, cos.min()


def test_tile_rows_bounds_the_score_tile() -> None:
    assert gemm_attention.tile_rows(2, 16384) == gemm_attention.TILE_ROWS
    assert gemm_attention.tile_rows(8, 16384) == 128  # 8 groups x 128 rows x 16K keys = 2^24
    assert gemm_attention.tile_rows(16, 1 << 22) == gemm_attention.MIN_TILE_ROWS


@pytest.mark.skipif(attention._FLASH_LSE is None, reason="no CPU flash op in this torch")
def test_paged_bf16_takes_the_gemm_route_and_agrees_with_flash(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two requests in one packed step: a first chunk and a chunk over scattered cache slots
    (the first chunk long enough not to go to SDPA whole, short enough for the native kernel
    not to take it)."""
    gen = torch.Generator().manual_seed(1)
    heads, kv_heads, d, start, n0, n1 = 8, 4, 32, 90, 40, 25
    monkeypatch.setattr(attention, "SDPA_WHOLE_BELOW", 32)
    slots = torch.randperm(400, generator=gen)[: start + n1]
    cache = torch.zeros(2, 400, kv_heads, d, dtype=torch.bfloat16)
    k_all = torch.randn(start + n1, kv_heads, d, generator=gen).bfloat16()
    v_all = torch.randn(start + n1, kv_heads, d, generator=gen).bfloat16()
    cache[0, slots[:start]], cache[1, slots[:start]] = k_all[:start], v_all[:start]
    k0 = torch.randn(n0, kv_heads, d, generator=gen).bfloat16()
    v0 = torch.randn(n0, kv_heads, d, generator=gen).bfloat16()
    q = torch.randn(n0 + n1, heads, d, generator=gen).bfloat16()
    k, v = torch.cat([k0, k_all[start:]]), torch.cat([v0, v_all[start:]])
    meta = AttentionMetadata(
        seqs=[SeqSpan(0, n0, 0, None), SeqSpan(n0, n1, start, slots)],
        slot_mapping=torch.cat([torch.full((n0,), 399), slots[start:]]),  # slot 399: scratch
    )
    calls: list[int] = []

    def counted(*args: Any) -> torch.Tensor:
        calls.append(1)
        return gemm_attention.gemm_attention(*args)

    monkeypatch.setattr(attention, "gemm_attention", counted)
    got = paged_attention(q, k, v, cache.clone(), meta, scale=0.2)
    assert len(calls) == 2  # both requests went through the matmul route
    want = torch.cat([_reference(q[:n0], k0, v0, 0.2), _reference(q[n0:], k_all, v_all, 0.2)])
    flash = paged_attention(q, k, v, cache.clone(), meta, scale=0.2, route=CpuRoute.PYTORCH)
    assert len(calls) == 2
    for out in (got, flash):
        torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)


def test_kept_buffers_serve_a_thread_inside_and_outside_inference_mode() -> None:
    """A thread that ran the engine (inference mode) and then calls the route directly: the
    buffers made under inference mode must not be the ones written outside it. A fresh thread,
    so its buffers are made here."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(40, 4, 16, generator=gen).bfloat16()
    k, v = (
        torch.randn(2, 40, 16, generator=gen).bfloat16().transpose(1, 2).contiguous().transpose(1, 2)
        for _ in range(2)
    )  # fmt: skip  (not dense per head: copied into the kept buffers)
    out: list[torch.Tensor] = []

    def both_ways() -> None:
        with torch.inference_mode():
            out.append(gemm_attention.gemm_attention(q, k, v, 0.25).clone())
        out.append(gemm_attention.gemm_attention(q, k, v, 0.25))

    worker = threading.Thread(target=both_ways)
    worker.start()
    worker.join()
    assert len(out) == 2, "the call outside inference mode raised"
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=0)
