"""Vocab padding: the vocab-parallel lookup equals the checkpoint's table bit for bit at TP=1,
2 and 3 (151,669 rows: odd, a multiple of neither 64 nor 64 x N). That an id in the padding
range is refused: test_tp_engine.py."""

from __future__ import annotations

import multiprocessing
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from embedserve.models.loader import iter_weights, read_model_dir
from embedserve.parallel.group import free_port
from embedserve.parallel.sharding import plan_shard
from tests.helpers.tp_ranks import DTYPES, lookup, lookup_worker


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


# CI time (2026-12-07): 1 and 2 ranks run in CI, 3 with `-m slow`
@pytest.mark.parametrize("world", [1, 2, pytest.param(3, marks=pytest.mark.slow)])
def test_lookup_is_bit_exact_at_any_size(qwen3_dir: Path, tmp_path: Path, world: int) -> None:
    # heads and MLP made divisible by 3: only the table is sharded here
    cfg = replace(
        read_model_dir(qwen3_dir).model, num_attention_heads=6, num_key_value_heads=6, intermediate_size=6
    )
    assert cfg.vocab_size % 2 == 1 and cfg.vocab_size % (64 * world) != 0
    weights = read_model_dir(qwen3_dir).weight_files
    table = next(t for name, t in iter_weights(weights) if name.endswith("embed_tokens.weight"))
    table[7] = -0.0  # negative zeros must come out negative: out-of-shard ranks add -0.0
    table[8, :5] = -0.0
    files = [tmp_path / "embed.safetensors"]
    save_file({"model.embed_tokens.weight": table}, str(files[0]))
    # every shard's first and last id, the real vocab's last, and a spread in between
    edges = [s.vocab_start + o for s in (plan_shard(cfg, world, r) for r in range(world)) for o in (0, -1)]
    spread = range(0, cfg.vocab_size, 9973)
    ids = sorted({i for i in [*edges, 7, 8, cfg.vocab_size - 1, *spread] if 0 <= i < cfg.vocab_size})
    port = free_port()
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=lookup_worker, args=(r, world, port, cfg, files, ids), daemon=True)
        for r in range(1, world)
    ]
    for p in procs:
        p.start()
    try:
        got = lookup(0, world, port, cfg, files, ids)
    finally:
        for p in procs:
            p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    for dtype, out in zip(DTYPES, got, strict=True):
        want = torch.nn.functional.embedding(torch.tensor(ids), table.to(dtype))
        assert out.shape == want.shape
        assert torch.equal(_bits(out), _bits(want)), dtype
        assert torch.signbit(out[ids.index(7)]).all()
