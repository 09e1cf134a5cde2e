"""The CPU chunk route (prefix + causal self, merged by log-sum-exp) equals masked attention."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention

from embedserve.attention import cpu as attention
from embedserve.attention.cpu import paged_attention
from embedserve.attention.metadata import AttentionMetadata, SeqSpan

pytestmark = pytest.mark.skipif(attention._FLASH_LSE is None, reason="no CPU flash op in this torch")


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_split_route_equals_one_masked_softmax(dtype: torch.dtype, tol: float) -> None:
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, d, start, n = 8, 2, 16, 45, 13
    slots = torch.randperm(200, generator=gen)[: start + n]  # scattered cache slots
    cache = torch.zeros(2, 200, kv_heads, d, dtype=dtype)
    k_all = torch.randn(start + n, kv_heads, d, generator=gen).to(dtype)
    v_all = torch.randn(start + n, kv_heads, d, generator=gen).to(dtype)
    cache[0, slots[:start]] = k_all[:start]
    cache[1, slots[:start]] = v_all[:start]
    q = torch.randn(n, heads, d, generator=gen).to(dtype)
    meta = AttentionMetadata(
        seqs=[SeqSpan(q_start=0, q_len=n, start=start, kv_slots=slots)], slot_mapping=slots[start:]
    )
    got = paged_attention(q, k_all[start:], v_all[start:], cache, meta, scale=0.3)
    mask = torch.arange(start + n)[None, :] <= torch.arange(start, start + n)[:, None]
    want = (
        scaled_dot_product_attention(
            q.float().transpose(0, 1)[None],
            k_all.float().repeat_interleave(4, 1).transpose(0, 1)[None],
            v_all.float().repeat_interleave(4, 1).transpose(0, 1)[None],
            attn_mask=mask,
            scale=0.3,
        )[0]
        .transpose(0, 1)
        .flatten(1)
    )
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("route", [None, *attention.CpuRoute])
@pytest.mark.parametrize(
    ("q", "kv"),
    [
        ((16, 16, 128), (16, 8, 128)),  # keys token-major by mistake: 8 keys for 16 queries
        ((4, 6, 32), (4, 8, 32)),  # heads not a multiple of kv_heads
        ((4, 8, 32), (2, 8, 16)),  # another head_dim
    ],
)
def test_keys_that_do_not_fit_the_queries_raise_instead_of_crashing(
    route: attention.CpuRoute | None, q: tuple[int, ...], kv: tuple[int, ...]
) -> None:
    # ATen's flash kernel took the first case with SIGFPE (the whole process) before the check
    query, keys = torch.randn(*q), torch.randn(*kv)
    with pytest.raises(ValueError, match=r"keys, values \[kv_heads, kv >= n, d\]"):
        attention.causal_attention(query, keys, keys.clone(), 0.1, route)
