"""A vocab-parallel embedding lookup on one rank of N, for tests that spawn the other ranks
(module-level functions: a spawned process imports them by name)."""

from __future__ import annotations

from pathlib import Path

import torch

from embedserve.config import ModelConfig
from embedserve.parallel.group import Group
from embedserve.parallel.model import VocabParallelEmbedding, read_shards
from embedserve.parallel.sharding import plan_shard

DTYPES = (torch.float32, torch.bfloat16)


def lookup(
    rank: int, world: int, port: int, cfg: ModelConfig, files: list[Path], ids: list[int]
) -> list[torch.Tensor]:
    """This rank's lookup of `ids` through its shard of the checkpoint's table, after the
    all-reduce: one result per dtype of DTYPES."""
    torch.set_num_threads(1)
    shard = plan_shard(cfg, world, rank)
    table = next(t for name, t in read_shards(files, shard) if name.endswith("embed_tokens.weight"))
    group = Group(rank, world, torch.device("cpu"))
    layers = []
    for dtype in DTYPES:
        emb = VocabParallelEmbedding(shard.vocab_rows, cfg.hidden_size, shard.vocab_start, group)
        emb.weight.data = table.to(dtype)
        layers.append(emb)
    group.connect(port)
    with torch.inference_mode():
        return [emb(torch.tensor(ids)) for emb in layers]


def lookup_worker(
    rank: int, world: int, port: int, cfg: ModelConfig, files: list[Path], ids: list[int]
) -> None:
    lookup(rank, world, port, cfg, files, ids)
