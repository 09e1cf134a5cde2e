"""Property tests of `Engine.embed` (hypothesis): any input gets a finite vector of the right
shape, the same vector alone or in a batch, or InvalidInputError — never another exception."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedserve import Engine
from embedserve.errors import InvalidInputError
from tests.helpers.reference import cosine

EXAMPLES = int(os.environ.get("EMBEDSERVE_FUZZ_EXAMPLES", "25"))
PROPERTY = settings(
    max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
ids = st.lists(st.integers(0, 151_642), min_size=1, max_size=300)
options = st.fixed_dictionaries(
    {},
    optional={
        "dimensions": st.integers(-2, 70),
        "normalize": st.booleans(),
        "priority": st.sampled_from(["online", "batch", "urgent"]),
        "truncate": st.sampled_from(["error", "end", "start", "middle"]),
        "prompt_name": st.sampled_from(["query", "document", "nope"]),
    },
)


@pytest.fixture(scope="module")
def engine(qwen3_dir: Path) -> Iterator[Engine]:
    with Engine.from_pretrained(qwen3_dir, max_model_len=256, max_num_batched_tokens=128) as e:
        yield e


@PROPERTY
@given(seqs=st.lists(ids, min_size=1, max_size=5))
def test_token_ids_give_the_same_unit_vector_alone_or_batched(engine: Engine, seqs: list[list[int]]) -> None:
    seqs = [s[:256] for s in seqs]
    batch = engine.embed(seqs)
    assert batch.shape == (len(seqs), 64) and np.isfinite(batch).all()
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, rtol=1e-5)
    alone = np.stack([engine.embed([s])[0] for s in seqs])
    assert cosine(batch, alone).min() >= 0.99999


@PROPERTY
@given(texts=st.lists(st.text(max_size=400), min_size=0, max_size=4), opts=options)
def test_any_text_and_options_give_a_vector_or_a_clear_refusal(
    engine: Engine, texts: list[str], opts: dict[str, object]
) -> None:
    try:
        out = engine.embed(texts, **opts)  # type: ignore[arg-type]
    except InvalidInputError as e:
        assert str(e)  # names the problem; anything else escaping fails the test
        return
    dims = opts.get("dimensions") or 64
    assert out.shape == (len(texts), dims) and np.isfinite(out).all()
    if opts.get("normalize", True):
        np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)


def test_the_engine_is_idle_and_alive_after_the_properties(engine: Engine) -> None:
    assert engine.alive
    stats = engine.stats()
    assert stats["num_running"] == stats["num_waiting"] == stats["kv_blocks_used"] == 0
