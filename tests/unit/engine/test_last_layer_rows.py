"""The last decoder layer finishes only the rows pooling reads (its other rows' output is
never used), in the lane and in the chunked path; vectors still equal the HF reference."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import pytest
import torch

from embedserve import Engine
from embedserve.config import PoolingMethod
from embedserve.engine.builder import build_engine
from embedserve.models.decoder_layer import DecoderLayer
from embedserve.request import EmbedParams, Request
from embedserve.worker.layer_major import LayerMajorJob
from tests.helpers.reference import cosine, hf_embed_ids, random_ids


def _mlp_rows(engine: Engine) -> dict[int, list[int]]:
    """Rows each layer's MLP sees, per call, recorded from here on."""
    model = engine._loop.core.runner.model
    seen: dict[int, list[int]] = {i: [] for i in range(len(model.layers))}
    for i, layer in enumerate(model.layers):
        cast(DecoderLayer, layer).mlp.register_forward_hook(
            lambda _m, args, _out, i=i: seen[i].append(args[0].shape[0])
        )
    return seen


@pytest.mark.parametrize(
    ("fixture", "pooling", "lane"),
    [
        ("qwen3_dir", "lasttoken", 1),
        ("qwen3_dir", "lasttoken", 0),
        ("qwen2_dir", "mean", 1),
        ("llama_dir", "cls", 1),
    ],
)
def test_last_layer_runs_only_pooled_rows(
    request: pytest.FixtureRequest, fixture: str, pooling: str, lane: int
) -> None:
    path: Path = request.getfixturevalue(fixture)
    lengths = (3, 130, 700)
    seqs = [random_ids(n, seed=n + 40) for n in lengths]
    ref = hf_embed_ids(path, seqs, pooling=pooling)
    with Engine.from_pretrained(
        path, max_num_batched_tokens=128, layer_major_tokens=lane, pooling=pooling
    ) as engine:
        seen = _mlp_rows(engine)
        got = engine.embed(seqs)
    assert cosine(got, ref).min() >= 0.99999
    last = max(seen)
    assert sum(seen[0]) == sum(lengths)  # every row through the first layers
    pooled = sum(lengths) if pooling == "mean" else len(lengths)
    assert sum(seen[last]) == pooled  # the last layer's MLP: pooled rows only


def test_lane_unit_flops_count_the_last_layer_as_stored_rows(qwen3_dir: Path) -> None:
    core = build_engine(qwen3_dir, max_num_batched_tokens=256, layer_major_tokens=1).core
    assert core.lane is not None
    ids = random_ids(600, seed=2)
    req = Request(0, ids, EmbedParams(normalize=True), PoolingMethod.LAST)
    job = LayerMajorJob(core.lane.model, req, 256, torch.device("cpu"))
    full = job.unit_flops(256)
    while job.layer < job.num_layers - 1:
        job.run(10**9 if job.layer < job.num_layers - 2 else 600)
    assert (job.layer, job.pos) == (job.num_layers - 1, 0)
    assert job.unit_flops(256) == 256 * job.flops_per_stored_row < full / 4  # K/V only
    job.run(512)
    tail = job.unit_flops(88)  # the last row runs the whole layer over 600 keys
    assert tail == 87 * job.flops_per_stored_row + job.flops_per_row + job.flops_per_key * 600
    job.run(88)
    for start, n, rows in job.pooled_rows():
        req.pooling.update(start, n, rows)
    np.testing.assert_allclose(
        cosine(req.pooling.finish().numpy()[None], hf_embed_ids(qwen3_dir, [ids])), 1.0, atol=1e-5
    )
