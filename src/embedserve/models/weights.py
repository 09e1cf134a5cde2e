"""Copy checkpoint tensors into a model whose projections may be fused (q|k|v, gate|up).

A checkpoint stores `q_proj`, `k_proj`, `v_proj` apart; our models keep them as row shards of
one parameter so a layer runs one matmul instead of three:

    qkv.weight rows  [0, q) <- q_proj   [q, q+kv) <- k_proj   [q+kv, q+2kv) <- v_proj

Every expected (parameter, shard) must arrive exactly once, or loading fails naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from embedserve.errors import ModelLoadError
from embedserve.models.tensor_file import is_mapped

# Where a checkpoint tensor goes: (our parameter name, shard index or None), or None to skip it.
Route = tuple[str, int | None]


def load_fused(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    route: Callable[[str], Route | None],
    shard_sizes: Callable[[str], list[int] | None],
    arch: str,
) -> None:
    """`shard_sizes(param_name)` gives a fused parameter's row split (None when not fused)."""
    params = dict(model.named_parameters())
    loaded: set[tuple[str, int | None]] = set()
    for raw_name, tensor in weights:
        where = route(raw_name)
        if where is None:
            continue
        target, shard = where
        if target not in params:
            raise ModelLoadError(f"unexpected weight {raw_name!r} for {arch}")
        if (target, shard) in loaded:
            raise ModelLoadError(f"weight {raw_name!r} appears twice in the checkpoint")
        dst: torch.Tensor = params[target]
        sizes = shard_sizes(target)
        if shard is not None:
            assert sizes is not None, f"{target} is not a fused parameter"
            dst = dst.narrow(0, sum(sizes[:shard]), sizes[shard])
        if shard is None and is_mapped(tensor) and _adoptable(dst, tensor):
            dst.data = tensor  # the file's map itself: rows never read stay on disk (tensor_file.py)
        else:
            _copy(dst, tensor, raw_name)
        loaded.add((target, shard))
    expected: set[tuple[str, int | None]] = set()
    for name in params:
        sizes = shard_sizes(name)
        expected.update([(name, None)] if sizes is None else [(name, i) for i in range(len(sizes))])
    missing = sorted(f"{n}[{s}]" if s is not None else n for n, s in expected - loaded)
    if missing:
        raise ModelLoadError(f"weights missing from the {arch} checkpoint: {', '.join(missing[:5])}")


def _adoptable(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """A mapped tensor can be the parameter itself: same shape and dtype, in host memory."""
    return dst.device.type == "cpu" and dst.dtype == src.dtype and tuple(dst.shape) == tuple(src.shape)


def _copy(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise ModelLoadError(f"weight {name!r} has shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
    with torch.no_grad():
        dst.copy_(src.to(dst.dtype))
