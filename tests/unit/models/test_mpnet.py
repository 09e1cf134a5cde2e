"""MPNet (all-mpnet-base-v2's architecture): engine vs sentence-transformers on a tiny random-weight
model, the relative position bias included."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve import Engine
from embedserve.models.relative_bias import relative_buckets
from tests.helpers.reference import cosine, st_embed
from tests.helpers.tiny_bert import TOKENIZER_FILES, minilm_dir
from tests.helpers.tiny_models import write_st_files

SENTENCE = "the lift of a wing in a propeller slipstream was measured at several angles of attack"


def texts(counts: list[int]) -> list[str]:
    words = SENTENCE.split()
    return [" ".join(words[i % len(words)] for i in range(n)) for n in counts]


def build_mpnet(dst: Path, *, masked_lm: bool = True, bias_scale: float = 2.0) -> Path:
    """Saved as MPNetForMaskedLM (`mpnet.` prefix, LM head) like all-mpnet-base-v2; the bias
    table drawn large, so positions matter."""
    import transformers

    config = transformers.MPNetConfig(
        vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=514, relative_attention_num_buckets=32,
        pad_token_id=1,
    )  # fmt: skip
    model = transformers.MPNetForMaskedLM(config) if masked_lm else transformers.MPNetModel(config)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                scale = bias_scale if "relative_attention_bias" in name else 0.3
                p.copy_(scale * torch.randn(p.shape, generator=gen))
    model.save_pretrained(dst, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, dst / name)
    write_st_files(dst, 64, "mean", True, {}, 384)
    return dst


@pytest.fixture(scope="module")
def mpnet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mpnet(tmp_path_factory.mktemp("mpnet") / "m")


def test_mpnet_matches_sentence_transformers(mpnet_dir: Path) -> None:
    batch = texts([1, 4, 9, 30, 90, 200, 350, 2])
    ref = st_embed(mpnet_dir, batch, batch_size=3)
    with Engine.from_pretrained(mpnet_dir) as engine:
        cfg = engine.config.model
        assert (cfg.relative_attention_buckets, cfg.position_offset, cfg.type_vocab_size) == (32, 2, 0)
        assert engine.config.scheduler.max_model_len == 384
        got = engine.embed(batch)
    assert cosine(got, ref).min() >= 0.99999


def test_mpnet_bias_matters_and_is_read_from_the_base_model_too(tmp_path: Path) -> None:
    """An MPNetModel save (no prefix) loads too; the same weights without the bias differ."""
    d = build_mpnet(tmp_path / "base", masked_lm=False)
    batch = texts([60, 200])
    ref = st_embed(d, batch)
    with Engine.from_pretrained(d) as engine:
        assert cosine(engine.embed(batch), ref).min() >= 0.99999
        engine_model = engine._loop.core.runner.model
        engine_model.relative_bias.weight.data.zero_()
        assert cosine(engine.embed(batch), ref).max() < 0.999


def test_relative_buckets_follow_transformers() -> None:
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    n = 300
    pos = torch.arange(n)
    ref = MPNetEncoder.relative_position_bucket(pos[None, :] - pos[:, None], num_buckets=32)
    assert torch.equal(relative_buckets(n, 32, torch.device("cpu")), ref)
    assert np.unique(ref.numpy()).size == 31  # every bucket but "distance 0, key after the query"
