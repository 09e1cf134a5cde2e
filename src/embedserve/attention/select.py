"""Which attention route a device runs, decided once per (device, dtype).

    CPU                          -> attention.cpu.paged_attention (its own choice per chunk)
    CUDA, fp16/bf16, sm80+, a flash varlen kernel that passes the self-check
                                 -> VarlenAttention (one flash varlen call per layer)
    other CUDA                   -> lower_right_attention (per-sequence SDPA, no mask tensor)

The varlen kernel comes from the installed PyTorch (its public `varlen_attn` where present,
else the `_flash_attention_forward` op it wraps); both are checked against `paged_attention`
on a small chunked batch before use, so an API change between PyTorch versions turns into
the slower correct route, not into wrong vectors.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import logging
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import torch

from embedserve.attention.cpu import paged_attention
from embedserve.attention.cuda import VarlenAttention, VarlenKernel, lower_right_attention
from embedserve.attention.metadata import AttentionFn, AttentionMetadata, seq_span, slots

log = logging.getLogger(__name__)

SELF_CHECK_TOLERANCE = 1e-2  # relative error vs float32: bf16 rounding is ~4e-3, a real bug 5e-2 and up


class Route(str, enum.Enum):
    CPU = "cpu"  # attention.cpu.paged_attention
    SDPA_LOWER_RIGHT = "sdpa-lower-right"
    FLASH_VARLEN = "flash-varlen"


def choose_route(
    device_type: str, dtype: torch.dtype, capability: tuple[int, int] | None, varlen_ok: bool
) -> Route:
    """Pure policy: flash kernels need CUDA, sm80+ and a 16-bit dtype."""
    if device_type != "cuda":
        return Route.CPU
    sm80 = capability is not None and capability >= (8, 0)
    flash_capable = dtype in (torch.float16, torch.bfloat16) and sm80
    return Route.FLASH_VARLEN if flash_capable and varlen_ok else Route.SDPA_LOWER_RIGHT


@dataclass(frozen=True)
class NamedAttention:
    """An AttentionFn that says which route it is (benchmarks and logs report it)."""

    name: str
    fn: AttentionFn

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        return self.fn(q, k, v, kv_cache, meta, scale)


def torch_varlen_kernels() -> list[tuple[str, VarlenKernel]]:
    """Flash varlen entry points of the installed PyTorch, public API first."""
    found: list[tuple[str, VarlenKernel]] = []
    try:
        varlen_attn: Any = importlib.import_module("torch.nn.attention.varlen").varlen_attn
    except (ImportError, AttributeError):
        varlen_attn = None
    if varlen_attn is not None:
        params = inspect.signature(varlen_attn).parameters
        # The causal switch moved from `is_causal` to `window_size=(-1, 0)` between releases.
        opts: dict[str, Any] = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
        if "enable_gqa" in params:
            opts["enable_gqa"] = True
        has_scale = "scale" in params

        def public(q, k, v, cu_q, cu_k, max_q, max_k, scale):  # type: ignore[no-untyped-def]
            extra = {"scale": scale} if has_scale else {}
            return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **opts, **extra)

        found.append(("torch.nn.attention.varlen.varlen_attn", public))
    if hasattr(torch.ops.aten, "_flash_attention_forward"):

        def aten(q, k, v, cu_q, cu_k, max_q, max_k, scale):  # type: ignore[no-untyped-def]
            # (query, key, value, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, return_debug_mask)
            return torch.ops.aten._flash_attention_forward(
                q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False, scale=scale
            )[0]

        found.append(("aten._flash_attention_forward", aten))
    return found


def self_check(fn: AttentionFn, device: torch.device, dtype: torch.dtype, block_size: int = 16) -> float:
    """max |fn - reference| / max |reference| on a two-sequence step, reference = `paged_attention`
    in float32 on the same (dtype-rounded) inputs.

    Sequence 0 is a first chunk; sequence 1 continues after 50 cached tokens, so both the
    cache write and the bottom-right causal alignment are exercised. 8 query heads over
    2 KV heads of head_dim 128 (GQA as in Qwen3).
    """
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, d = 8, 2, 128
    meta, t = _check_step(block_size, device)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    q, k, v = rand(t, heads, d), rand(t, kv_heads, d), rand(t, kv_heads, d)
    cache = rand(2, 8 * block_size, kv_heads, d)
    scale = d**-0.5
    want = paged_attention(q.float(), k.float(), v.float(), cache.float(), meta, scale)
    got = fn(q, k, v, cache.clone(), meta, scale).float()
    return float((want - got).abs().max() / want.abs().max())


def _check_step(block_size: int, device: torch.device) -> tuple[AttentionMetadata, int]:
    """The self-check's step: a 37-token first chunk (blocks 0-2), then 29 tokens after 50
    cached ones (blocks 5, 3, 7, 4, 6). Returns its metadata and packed row count."""
    parts = [(0, 37, 0, [0, 1, 2]), (37, 29, 50, [5, 3, 7, 4, 6])]  # (q_start, n, start, table)
    seqs = [seq_span(q0, n, start, table, block_size, device) for q0, n, start, table in parts]
    mapping = np.concatenate(
        [slots(table, np.arange(start, start + n), block_size) for _, n, start, table in parts]
    )
    return AttentionMetadata(seqs, torch.from_numpy(mapping).to(device)), sum(p[1] for p in parts)


def _working_kernel(device: torch.device, dtype: torch.dtype) -> tuple[str, VarlenKernel] | None:
    for name, kernel in torch_varlen_kernels():
        try:
            err = self_check(VarlenAttention(kernel), device, dtype)
        except Exception as e:  # missing op, unsupported arguments: try the next one
            log.info("varlen kernel %s unusable on %s: %s", name, device, e)
            continue
        if err <= SELF_CHECK_TOLERANCE:
            return name, kernel
        log.warning("varlen kernel %s is off by %.3g (relative) on %s: not used", name, err, device)
    return None


@cache
def select_attention(device: torch.device, dtype: torch.dtype) -> NamedAttention:
    """The attention route for tensors on `device` in `dtype` (probed once, then cached)."""
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    kernel = None
    if choose_route(device.type, dtype, capability, varlen_ok=True) is Route.FLASH_VARLEN:
        kernel = _working_kernel(device, dtype)
    route = choose_route(device.type, dtype, capability, varlen_ok=kernel is not None)
    log.info("attention route on %s/%s: %s", device, dtype, route.value)
    if route is Route.FLASH_VARLEN and kernel is not None:
        return NamedAttention(f"{route.value} ({kernel[0]})", VarlenAttention(kernel[1]))
    if route is Route.SDPA_LOWER_RIGHT:
        return NamedAttention(route.value, lower_right_attention)
    return NamedAttention(route.value, paged_attention)
