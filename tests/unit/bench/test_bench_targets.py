"""Target specs: the four kinds, their options, and clear errors for bad ones."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from embedserve.bench.baselines import Encode, FifoBatcher
from embedserve.bench.http_target import HttpSession
from embedserve.bench.target import parse_target
from embedserve.bench.targets import open_target
from embedserve.config import PoolingMethod
from embedserve.embedders.transformers import pool_padded
from embedserve.errors import InvalidInputError


def test_engine_spec_with_options(tmp_path: Path) -> None:
    t = parse_target(f"engine:{tmp_path}?dtype=bfloat16&max_num_seqs=8")
    assert (t.kind, t.location, t.has_budget_axis) == ("engine", str(tmp_path), True)
    assert t.options == {"dtype": "bfloat16", "max_num_seqs": "8"}
    assert t.int_option("max_num_seqs") == 8
    assert t.name == f"engine:{tmp_path.name}:bfloat16"
    assert t.model_dir == tmp_path


def test_baselines_have_no_budget_axis_and_take_a_name(tmp_path: Path) -> None:
    st = parse_target(f"sentence-transformers:{tmp_path}?batch_size=4&name=baseline")
    hf = parse_target(f"hf:{tmp_path}")
    assert (st.kind, st.name, st.has_budget_axis, st.int_option("batch_size")) == (
        "sentence-transformers",
        "baseline",
        False,
        4,
    )
    assert (hf.kind, hf.has_budget_axis) == ("hf", False)


def test_http_spec_strips_our_options_and_finds_the_route() -> None:
    t = parse_target("http://127.0.0.1:8011/v1?model=peer&pid=42&name=vllm&api=x")
    assert (t.kind, t.name, t.has_budget_axis, t.model_dir) == ("http", "vllm", False, None)
    assert t.options == {"model": "peer", "pid": "42"}
    assert t.location == "http://127.0.0.1:8011/v1?api=x"  # foreign query parameters stay in the URL
    assert HttpSession(parse_target("http://h:1/v1")).url == "http://h:1/v1/embeddings"
    assert HttpSession(parse_target("http://h:1/embeddings")).url == "http://h:1/embeddings"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("vllm:/x", "expected engine:PATH"),
        ("engine:", "no model directory"),
        ("engine:/definitely/not/here", "not a directory"),
        ("engine:{d}?max_num_batched_tokens=4", "unknown option"),
        ("sentence-transformers:{d}?batch_size=big", "positive integer"),
        ("http://h:1/v1?pid=abc", "positive integer"),
    ],
)
def test_bad_specs_name_the_problem(tmp_path: Path, spec: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        parse_target(spec.format(d=tmp_path))


def test_padded_pooling_reads_the_right_rows_for_either_padding_side() -> None:
    hidden = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1)  # [batch, seq, hidden]
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    assert pool_padded(hidden, left, PoolingMethod.LAST).flatten().tolist() == [3.0, 7.0]
    assert pool_padded(hidden, right, PoolingMethod.LAST).flatten().tolist() == [1.0, 7.0]
    assert pool_padded(hidden, left, PoolingMethod.CLS).flatten().tolist() == [2.0, 4.0]
    assert pool_padded(hidden, right, PoolingMethod.MEAN).flatten().tolist() == [0.5, 5.5]


def test_engine_target_opens_with_every_option_typed(qwen3_dir: Path) -> None:
    spec = parse_target(f"engine:{qwen3_dir}?dtype=bfloat16&max_num_seqs=3&layer_major_tokens=0&name=e")
    assert spec.typed_options() == {"dtype": "bfloat16", "max_num_seqs": 3, "layer_major_tokens": 0}
    session = open_target(spec, token_budget=128)
    cfg = session.engine.config  # type: ignore[attr-defined]
    try:
        assert (cfg.dtype, cfg.scheduler.max_num_seqs) == (torch.bfloat16, 3)
        assert (cfg.scheduler.max_num_batched_tokens, cfg.scheduler.layer_major_tokens) == (128, None)
    finally:
        session.engine.close()  # type: ignore[attr-defined]


def test_the_baseline_loads_its_model_on_the_thread_that_encodes(qwen3_dir: Path) -> None:
    import transformers

    seen: dict[str, int] = {}
    load = transformers.AutoModel.from_pretrained

    def recorded_load(*args: Any, **kwargs: Any) -> Any:
        seen["load"] = threading.get_ident()
        return load(*args, **kwargs)

    spec = parse_target(f"hf:{qwen3_dir}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transformers.AutoModel, "from_pretrained", recorded_load)
        session = open_target(spec, token_budget=None)
    assert isinstance(session, FifoBatcher)
    try:
        reply = asyncio.run(session.embed("hello there", "online"))
        assert reply.vector.shape == (64,)
        assert seen["load"] == session._thread.ident != threading.get_ident()
    finally:
        asyncio.run(session.aclose())


def test_a_baseline_that_fails_to_load_raises_from_the_constructor() -> None:
    def broken() -> Encode:
        raise OSError("weights missing")

    with pytest.raises(OSError, match="weights missing"):
        FifoBatcher(broken, 4, "cpu")
