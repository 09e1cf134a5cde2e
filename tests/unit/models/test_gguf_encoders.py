"""Encoder GGUFs as llama.cpp writes them (`bert`, `nomic-bert`, `gemma-embedding`): the engine on
the file against sentence-transformers on the directory it was written from, in f32, f16 and
q8_0; the real all-MiniLM-L6-v2 as a bert GGUF; the refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from embedserve.config import PoolingMethod
from embedserve.errors import ModelLoadError
from tests.helpers.gguf_encoders import write_encoder_gguf
from tests.helpers.reference import cosine, st_embed
from tests.helpers.tiny_bert import build_encoder, build_nomic, minilm_dir
from tests.helpers.tiny_gemma import build_gemma3
from tests.unit.models.test_nomic_bert import texts

# float32 files equal the directory; quantized ones as close as their rounding allows
MIN_COSINE = {"f32": 0.99999, "f16": 0.9995, "q8_0": 0.995}
SLIDING, FULL = "sliding_attention", "full_attention"


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf-encoders")
    return {
        "bert": build_encoder(root / "bert", "bert", pooling="cls", seed=4),
        "nomic-bert": build_nomic(root / "nomic", seed=3),
        # llama.cpp's layout for gemma-embedding: every 6th layer global, scores by 1/sqrt(head_dim)
        "gemma-embedding": build_gemma3(
            root / "gemma", layer_types=(SLIDING,) * 5 + (FULL,), query_pre_attn_scalar=40, window=16, seed=2
        ),
    }


@pytest.mark.parametrize("qtype", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("arch", ["bert", "nomic-bert", "gemma-embedding"])
def test_encoder_gguf_matches_sentence_transformers_on_its_source(
    sources: dict[str, Path], tmp_path: Path, arch: str, qtype: str
) -> None:
    src = sources[arch]
    gguf_file = write_encoder_gguf(tmp_path / f"{arch}.gguf", src, arch, qtype)
    batch = texts([3, 40, 7, 90, 1, 25])  # past gemma's ±8 window, mixed in one batch
    with Engine.from_pretrained(gguf_file) as engine:
        got = engine.embed(batch)
        ids = [t.token_ids for t in engine.renderer.text(batch)]
        pooling = engine.config.pooling
    ref_tok = st_tokenizer(src)
    assert ids == [ref_tok(t) for t in batch]
    want = {
        "bert": PoolingMethod.CLS,
        "nomic-bert": PoolingMethod.MEAN,
        "gemma-embedding": PoolingMethod.MEAN,
    }
    assert pooling.method is want[arch] and pooling.normalize
    if arch == "gemma-embedding":  # the Dense modules came along: 96 -> 384 -> 96
        assert [(d.in_features, d.out_features) for d in pooling.dense] == [(96, 384), (384, 96)]
    sims = cosine(got, st_embed(src, batch))
    assert sims.min() >= MIN_COSINE[qtype], sims


def st_tokenizer(src: Path):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return lambda text: tok.encode(text).ids


def test_real_minilm_as_a_bert_gguf_equals_sentence_transformers(tmp_path: Path) -> None:
    """The default model's real weights and vocabulary, through llama.cpp's layout."""
    gguf_file = write_encoder_gguf(tmp_path / "minilm.gguf", minilm_dir(), "bert")
    batch = [
        "What is the lift of a swept wing at Mach 2?",
        "Naïve café owners in 北京 don't like [MASK] tokens — or emoji 🚀.",
        " ".join(["boundary layer transition on a heated flat plate"] * 20),
        "x",
    ]
    with Engine.from_pretrained(gguf_file) as engine:
        got = engine.embed(batch)
        assert engine.config.model.max_position_embeddings == 512
    assert cosine(got, st_embed(minilm_dir(), batch)).min() >= MIN_COSINE["f32"]


def test_gguf_encoder_refusals(sources: dict[str, Path], tmp_path: Path) -> None:
    import gguf

    src = sources["bert"]
    good = write_encoder_gguf(tmp_path / "bert.gguf", src, "bert")
    reader = gguf.GGUFReader(good, "r+")  # writable memory map: flip pooling_type to RANK in place
    reader.fields["bert.pooling_type"].parts[-1][0] = 4
    del reader
    with pytest.raises(ModelLoadError, match=r"this bert GGUF is a reranker \(pooling_type rank\)"):
        Engine.from_pretrained(good)
    write_encoder_gguf(tmp_path / "causal.gguf", src, "bert")
    reader = gguf.GGUFReader(tmp_path / "causal.gguf", "r+")
    reader.fields["bert.attention.causal"].parts[-1][0] = 1
    del reader
    with pytest.raises(ModelLoadError, match="asks for causal attention; an encoder attends both ways"):
        Engine.from_pretrained(tmp_path / "causal.gguf")


def test_pooling_option_overrides_the_files_pooling_type(sources: dict[str, Path], tmp_path: Path) -> None:
    gguf_file = write_encoder_gguf(tmp_path / "bert.gguf", sources["bert"], "bert")
    with Engine.from_pretrained(gguf_file, pooling="mean", normalize=False) as engine:
        assert engine.config.pooling.method is PoolingMethod.MEAN
        raw = engine.embed(texts([5]))
    assert not np.isclose(np.linalg.norm(raw[0]), 1.0)
