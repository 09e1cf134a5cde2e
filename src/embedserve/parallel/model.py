"""One rank's decoder: the same `DecoderModel` built at the rank's shapes (parallel/sharding.py),
with the embedding and the two row-parallel projections of each layer swapped for their
parallel forms, and only the rank's slices read from the safetensors files.

Per layer and step, two all-reduces (after o_proj, after down_proj) and one for the
embedding; everything else (norms, RoPE, attention over the rank's own heads and KV cache)
runs on each rank alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import torch
from safetensors import safe_open
from torch import nn
from torch.nn import functional

from embedserve.attention.select import select_attention
from embedserve.config import ModelConfig
from embedserve.errors import ModelLoadError
from embedserve.models.decoder import DecoderModel
from embedserve.models.decoder_layer import DecoderLayer
from embedserve.models.linear import Linear
from embedserve.parallel.group import Group
from embedserve.parallel.sharding import Shard, check_row_parallel_bias, local_config, tensor_slice

# lm_head: the generation head, never used for embeddings (and as large as the vocabulary).
_SKIPPED = ("lm_head.",)


class RowParallelLinear(Linear):
    """y = x W^T where this rank holds W's columns for its part of x (its heads, or its MLP
    columns): the rank's partial products summed over ranks. No bias (see sharding.py)."""

    def __init__(self, in_features: int, out_features: int, group: Group) -> None:
        super().__init__(in_features, out_features, bias=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(super().forward(x).contiguous())


class VocabParallelEmbedding(nn.Embedding):
    """Rows [start, start + rows) of the padded table. An id outside them contributes -0.0,
    the exact additive identity (x + -0.0 == x bit for bit, -0.0 included), so after the
    all-reduce every row is the table's row, bit-exact, on every rank."""

    def __init__(self, rows: int, dim: int, start: int, group: Group) -> None:
        super().__init__(rows, dim)
        self.start = start
        self.group = group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start  # [T]
        inside = (local >= 0) & (local < self.weight.shape[0])
        x = functional.embedding(torch.where(inside, local, 0), self.weight)  # [T, hidden]
        x.masked_fill_(~inside[:, None], -0.0)
        return self.group.all_reduce(x)


def build_rank_model(
    cfg: ModelConfig, shard: Shard, files: list[Path], group: Group, device: torch.device, dtype: torch.dtype
) -> DecoderModel:
    """This rank's decoder with its weights (`cfg`: the whole model's config)."""
    local = local_config(cfg, shard)
    attention = select_attention(device, dtype)  # outside "meta": its self-check computes
    with torch.device("meta"):  # no memory until the rank's slices arrive
        model = DecoderModel(local, attention)
        model.embed_tokens = VocabParallelEmbedding(
            shard.vocab_rows, cfg.hidden_size, shard.vocab_start, group
        )
        for layer in model.layers:
            layer = cast(DecoderLayer, layer)
            layer.self_attn.o_proj = RowParallelLinear(shard.heads * shard.head_dim, cfg.hidden_size, group)
            layer.mlp.down_proj = RowParallelLinear(shard.intermediate, cfg.hidden_size, group)
    model = model.to_empty(device=device).to(dtype)
    model.load_weights(read_shards(files, shard))
    return model.eval()


def read_shards(files: list[Path], shard: Shard) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, this rank's slice) of every checkpoint tensor; the slices alone are read from
    disk. The embedding's last shard is zero-padded up to its rows."""
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open is not a dict
                    if name.removeprefix("model.").startswith(_SKIPPED):
                        continue
                    check_row_parallel_bias(name)
                    yield name, _read(handle, name, shard)
        except ModelLoadError:
            raise
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise ModelLoadError(f"cannot read weights from {f}: {e}") from e


def _read(handle: object, name: str, shard: Shard) -> torch.Tensor:
    part = tensor_slice(name, shard)
    if part is None:
        return cast(torch.Tensor, handle.get_tensor(name))  # type: ignore[attr-defined]
    dim, lo, hi = part
    view = handle.get_slice(name)  # type: ignore[attr-defined]
    size = int(view.get_shape()[dim])
    a, b = min(lo, size), min(hi, size)
    t = cast(torch.Tensor, view[a:b] if dim == 0 else view[:, a:b])
    if b - a < hi - lo:  # vocab padding rows: zeros, never looked up
        pad = torch.zeros((hi - lo - (b - a), *t.shape[1:]), dtype=t.dtype)
        t = torch.cat([t, pad])
    return t


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters on this rank."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
