"""Bad input gets a clear exception naming the problem; the engine keeps serving."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from embedserve.errors import InputTooLongError, InvalidInputError
from tests.helpers.engine_calls import embed_outputs
from tests.helpers.reference import cosine, hf_embed_ids, random_ids


@pytest.fixture(scope="module")
def engine(qwen3_dir: Path) -> Engine:
    with Engine.from_pretrained(qwen3_dir, max_model_len=512, max_num_batched_tokens=128) as e:
        yield e


@pytest.mark.parametrize(
    ("inputs", "kwargs", "match"),
    [
        ([""], {}, "input 0: input is an empty string"),
        ([[]], {}, "input 0: input is an empty token list"),
        ([], {}, "inputs is empty"),
        ([[1, 2, 151669]], {}, "token id 151669 is outside the vocabulary"),
        ([[1, -3]], {}, "token id -3 is outside the vocabulary"),
        (["ok", 5], {}, "input 1: expected a string or a list of token ids, got int"),
        (["ok"], {"prompt_name": "nope"}, "unknown prompt name 'nope'; this model defines: document, query"),
        (["ok"], {"prompt_name": "query", "prompt": "x"}, "either prompt_name or prompt"),
        ([[1, 2]], {"prompt_name": "query"}, "prompt cannot be combined with token-id inputs"),
        (["ok"], {"dimensions": 0}, r"dimensions must be an integer in \[1, 64\]"),
        (["ok"], {"dimensions": 65}, r"dimensions must be an integer in \[1, 64\]"),
        (["ok"], {"priority": "urgent"}, "unknown priority 'urgent'"),
        (["ok"], {"truncate": "middle"}, "unknown truncate policy 'middle'"),
    ],
)
def test_bad_input_is_refused_clearly(engine: Engine, inputs: list, kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        engine.embed(inputs, **kwargs)


def test_over_long_input_states_count_and_limit(engine: Engine) -> None:
    with pytest.raises(InputTooLongError, match="input 1: 600 tokens exceed the limit of 512 tokens"):
        engine.embed([[5] * 10, [5] * 600])
    with pytest.raises(InputTooLongError, match="exceed the limit of 512"):
        engine.embed(["word " * 1000])


def test_truncation_keeps_the_end_token_and_says_so(engine: Engine, qwen3_dir: Path) -> None:
    text = "word " * 1000
    end, start = (
        embed_outputs(engine, [text], truncate="end")[0],
        embed_outputs(engine, [text], truncate="start")[0],
    )
    assert end.truncated and start.truncated and end.num_tokens == start.num_tokens == 512
    ids = engine.tokenizer.backend.encode(text).ids
    kept = [*ids[:511], 151643]  # content cut, <|endoftext|> kept for last-token pooling
    assert ids[-1] == 151643
    assert cosine(end.embedding[None], hf_embed_ids(qwen3_dir, [kept]))[0] >= 0.99999
    ids_out = embed_outputs(engine, [[7] * 600 + [151643]], truncate="end")[0]
    assert ids_out.truncated and ids_out.num_tokens == 512


def test_engine_keeps_serving_after_errors(engine: Engine, qwen3_dir: Path) -> None:
    for bad in ([""], [[151669]], [[1] * 9999]):
        with pytest.raises(InvalidInputError):
            engine.embed(bad)
    seqs = [random_ids(200, seed=3)]
    assert engine.alive
    assert cosine(engine.embed(seqs), hf_embed_ids(qwen3_dir, seqs))[0] >= 0.99999
    assert engine.stats()["num_waiting"] == 0  # nothing of the refused calls was queued


def test_one_bad_item_queues_nothing(engine: Engine) -> None:
    before = engine.stats()["tokens_computed"]
    with pytest.raises(InvalidInputError, match="input 2"):
        engine.embed([[1] * 100, [2] * 100, ""])
    assert engine.stats()["tokens_computed"] == before
    assert isinstance(engine.embed(["fine"]), np.ndarray)
