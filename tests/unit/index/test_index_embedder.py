"""EngineEmbedder: the server's schema, prompts per input kind, truncation per input kind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from embedserve.errors import InputTooLongError, InvalidInputError
from embedserve.index.engine_embedder import EngineEmbedder
from embedserve.schema import ModelMetadata, fingerprint_model_dir

MAX_LEN = 64


@pytest.fixture(scope="module")
def engine(qwen3_dir: Path) -> Iterator[Engine]:
    with Engine.from_pretrained(qwen3_dir, max_model_len=MAX_LEN) as e:
        yield e


def test_schema_is_the_servers(engine: Engine, qwen3_dir: Path) -> None:
    emb = EngineEmbedder(engine, "tiny", dimensions=32)
    served = ModelMetadata.from_engine_config(engine.config, "tiny", None, fingerprint_model_dir(qwen3_dir))
    assert emb.meta.fields() == served.fields(32)
    assert emb.dimension == 32 and emb.max_tokens == MAX_LEN
    assert EngineEmbedder(engine, "tiny").meta.embedding_schema != emb.meta.embedding_schema


def test_prompts_and_truncation_per_input_kind(engine: Engine) -> None:
    emb = EngineEmbedder(engine, "tiny")
    text = "the boundary layer separates"
    # The second of two equal requests starts from the first's cached prefix: equal to rounding.
    same = {"rtol": 0, "atol": 1e-6}
    np.testing.assert_allclose(
        emb.embed_documents([text]), engine.embed([text], prompt_name="document"), **same
    )
    np.testing.assert_allclose(emb.embed_queries([text]), engine.embed([text], prompt_name="query"), **same)
    long = "word " * (2 * MAX_LEN)
    assert emb.embed_queries([long]).shape == (1, engine.config.model.hidden_size)  # cut at the end
    with pytest.raises(InputTooLongError):
        emb.embed_documents([long])  # a chunk that does not fit is a bug, never silently cut
    with pytest.raises(InvalidInputError, match="unknown prompt name 'nope'"):
        EngineEmbedder(engine, "tiny", query_prompt_name="nope")
