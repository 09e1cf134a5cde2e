"""Short whole sequences of one length attend in one batched SDPA call per step
(`attention/cpu_batched.py`, `short_whole_together`), with the same bits as one call each."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from embedserve.attention import cpu as attention
from embedserve.attention import cpu_batched
from embedserve.attention.cpu import causal_attention, paged_attention
from embedserve.attention.metadata import AttentionMetadata, SeqSpan


def _meta(lengths: list[int]) -> AttentionMetadata:
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    spans = [
        SeqSpan(q_start=s, q_len=n, start=0, kv_slots=None) for s, n in zip(starts, lengths, strict=True)
    ]
    return AttentionMetadata(seqs=spans, slot_mapping=None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("lengths", "calls"),
    [
        ([16] * 32, [(32, 16)]),  # 32 queries of one length: one call
        # three 16s apart from each other (gathered), two 7s; 1 and 63 alone
        ([16, 7, 16, 16, 1, 7, 63], [(1, 1), (1, 63), (2, 7), (3, 16)]),
        ([5, 100, 5], [(2, 5)]),  # 100 rows take the tiled routes
    ],
)
def test_same_bits_as_one_call_per_sequence(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, lengths: list[int], calls: list[tuple[int, int]]
) -> None:
    gen = torch.Generator().manual_seed(len(lengths))
    rows = sum(lengths)
    q = torch.randn(rows + 3, 8, 32, generator=gen).to(dtype)  # 3 rows of bucket padding
    kv = torch.randn(rows + 3, 2, 2, 32, generator=gen).to(dtype)
    k, v = kv[:, 0], kv[:, 1]  # strided views, as the model's fused projection gives them
    meta = _meta(lengths)
    alone = torch.cat(
        [
            causal_attention(q[r], k[r].transpose(0, 1), v[r].transpose(0, 1), 0.2)
            for r in (slice(s.q_start, s.q_start + s.q_len) for s in meta.seqs)
        ]
    )
    seen: list[tuple[int, int]] = []
    real = attention.scaled_dot_product_attention

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        batch, _, length, _ = args[0].shape
        if length < attention.SDPA_WHOLE_BELOW:
            seen.append((batch, length))
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "scaled_dot_product_attention", counted)
    monkeypatch.setattr(cpu_batched, "scaled_dot_product_attention", counted)
    got = paged_attention(q, k, v, None, meta, 0.2)
    assert torch.equal(got[:rows], alone)
    assert not got[rows:].any()  # padding rows stay zeros
    assert sorted(seen) == calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_short_chunks_after_cached_context_grouped_equal_one_call_each(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """Prefix-cache hits: chunks of 17 queries after 19 cached positions (a shared instruction),
    scattered over the cache; grouped into one masked SDPA call per (queries, keys), the same
    as each chunk's own attention to rounding."""
    gen = torch.Generator().manual_seed(7)
    n_seqs, ctx, n, slots = 5, 19, 17, 512
    cache = torch.randn(2, slots, 2, 32, generator=gen).to(dtype)
    q = torch.randn(n_seqs * n + 1, 8, 32, generator=gen).to(dtype)  # one row of bucket padding
    perm = torch.randperm(slots, generator=gen)
    spans, alone = [], []
    for i in range(n_seqs):
        kv_slots = perm[i * (ctx + n) : (i + 1) * (ctx + n)]
        spans.append(SeqSpan(q_start=i * n, q_len=n, start=ctx, kv_slots=kv_slots))
        keys, values = (cache[j].index_select(0, kv_slots).transpose(0, 1) for j in (0, 1))
        alone.append(causal_attention(q[i * n : (i + 1) * n], keys, values, 0.2))
    calls: list[tuple[int, ...]] = []
    real = cpu_batched.scaled_dot_product_attention

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(tuple(args[0].shape))
        return real(*args, **kwargs)

    monkeypatch.setattr(cpu_batched, "scaled_dot_product_attention", counted)
    k_new = torch.zeros(q.shape[0], 2, 32, dtype=dtype)  # already in the cache: not written
    meta = AttentionMetadata(seqs=spans, slot_mapping=None)
    got = paged_attention(q, k_new, k_new, cache, meta, 0.2)
    assert calls == [(n_seqs, 8, n, 32)]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got[: n_seqs * n], torch.cat(alone), atol=tol, rtol=tol)
    assert not got[n_seqs * n :].any()
