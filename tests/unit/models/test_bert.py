"""BERT-family encoders: engine fp32 vs sentence-transformers on tiny random-weight models."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from embedserve.config import PoolingMethod
from embedserve.errors import InputTooLongError, ModelLoadError
from tests.helpers.engine_calls import embed_outputs
from tests.helpers.reference import cosine, st_embed
from tests.helpers.tiny_bert import build_encoder

FP32_MIN_COSINE = 0.99999
SENTENCE = "the lift of a wing in a propeller slipstream was measured at several angles of attack"


def texts(counts: list[int]) -> list[str]:
    words = SENTENCE.split()
    return [" ".join(words[i % len(words)] for i in range(n)) for n in counts]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_encoder(tmp_path_factory.mktemp("enc") / "bert", "bert", pooling="mean", normalize=True)


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("enc") / "roberta"
    return build_encoder(d, "roberta", pooling="cls", normalize=False, seed=1)


@pytest.mark.parametrize("budget", [128, 4096])
def test_bert_matches_sentence_transformers(bert_dir: Path, budget: int) -> None:
    # 118 words are 127 tokens; 126 and 200 words exceed max_seq_length (128):
    # sentence-transformers cuts the end, so do we.
    batch = texts([1, 2, 7, 60, 118, 126, 200, 40] * 3)
    ref = st_embed(bert_dir, batch, batch_size=5)
    with Engine.from_pretrained(bert_dir, max_num_batched_tokens=budget) as engine:
        assert engine.config.scheduler.max_model_len == 128 and not engine.config.model.is_causal
        outs = embed_outputs(engine, batch, truncate="end")
        steps = engine.stats()["steps"]
    got = np.stack([o.embedding for o in outs])
    assert cosine(got, ref).min() >= FP32_MIN_COSINE
    assert np.abs(np.linalg.norm(got, axis=1) - 1).max() < 1e-5
    assert [o.truncated for o in outs[:8]] == [False] * 5 + [True, True, False]
    if budget == 128:  # one whole sequence at most per step: several steps, never a partial one
        assert steps >= len(batch) // 2


def test_roberta_positions_and_cls_pooling_match(roberta_dir: Path) -> None:
    batch = texts([1, 5, 33, 118])
    with Engine.from_pretrained(roberta_dir) as engine:
        assert engine.config.pooling.method is PoolingMethod.CLS
        assert engine.config.model.position_offset == 1
        got = engine.embed(batch)
    ref = st_embed(roberta_dir, batch)
    assert cosine(got, ref).min() >= FP32_MIN_COSINE
    # Unnormalized as configured: the norms agree too, not only the directions.
    assert np.allclose(np.linalg.norm(got, axis=1), np.linalg.norm(ref, axis=1), rtol=1e-5)


def test_over_long_input_is_refused_with_the_limit(bert_dir: Path) -> None:
    with Engine.from_pretrained(bert_dir) as engine:
        with pytest.raises(InputTooLongError, match="input 1: 202 tokens exceed the limit of 128 tokens"):
            engine.embed(texts([3, 188]), truncate="error")
        cut = engine.renderer.text(texts([200]), truncate="end")[0].token_ids
        assert len(cut) == 128 and (cut[0], cut[-1]) == (101, 102)  # [CLS] ... [SEP] kept
    with (
        Engine.from_pretrained(bert_dir, max_model_len=512) as engine,  # the position table's limit
        pytest.raises(InputTooLongError, match="639 tokens exceed the limit of 512"),
    ):
        engine.embed(texts([600]))


def test_encoder_options_that_cannot_apply_are_refused(bert_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="kv_cache_memory does not apply to encoder"):
        Engine.from_pretrained(bert_dir, kv_cache_memory=1 << 20)
    with pytest.raises(ModelLoadError, match="cannot be chunked"):
        Engine.from_pretrained(bert_dir, max_num_batched_tokens=64)
    with pytest.raises(ModelLoadError, match="exceeds max_position_embeddings"):
        Engine.from_pretrained(bert_dir, max_model_len=513)


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_damaged_safetensors_is_a_clear_load_error(bert_dir: Path, tmp_path: Path, damage: str) -> None:
    d = Path(shutil.copytree(bert_dir, tmp_path / "broken"))
    weights = d / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x07" * 64 + data[64:])
    with pytest.raises(ModelLoadError, match=r"cannot read weights from .*model\.safetensors"):
        Engine.from_pretrained(d)
