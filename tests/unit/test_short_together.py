"""Short whole sequences of one length attend in one batched SDPA call per step
(`attention/cpu.py`, `_short_whole_together`), with the same bits as one call each."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from embedserve.attention import cpu as attention
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
    got = paged_attention(q, k, v, None, meta, 0.2)
    assert torch.equal(got[:rows], alone)
    assert not got[rows:].any()  # padding rows stay zeros
    assert sorted(seen) == calls
