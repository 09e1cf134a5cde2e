"""`--embedding-type`: compressed vectors indexed and searched under their own schema (Milvus Lite)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedserve.api.quantize import Calibration
from embedserve.engine.options import EngineOptions
from embedserve.index.chunking import Chunker
from embedserve.index.documents import Document
from embedserve.index.embedder import EmbedderSpec, load_tokenizer
from embedserve.index.embedders import build_embedder
from embedserve.index.errors import SchemaMismatchError
from embedserve.index.pipeline import index_documents
from embedserve.index.quantized import QuantizingEmbedder, stored_codes
from embedserve.index.search import search
from embedserve.index.store import Store
from embedserve.schema import compressed_schema
from tests.helpers.index_fakes import WordEmbedder
from tests.helpers.tiny_models import qwen_tokenizer_dir

TOPICS = ["wing flutter", "boundary layer", "shock wave", "heat transfer"]
DOCS = [Document(f"doc-{i}", f"Document {i} is about {TOPICS[i % 4]} and {TOPICS[i % 4]}.") for i in range(8)]


class CenteredWords(WordEmbedder):
    """Bag-of-words minus its mean: signs say which words occur (binary codes keep that)."""

    def _vectors(self, texts: list[str]) -> np.ndarray:
        v = super()._vectors(texts)
        return v - v.mean(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker(load_tokenizer(qwen_tokenizer_dir()), 48, 8)


def test_binary_codes_rank_as_hamming() -> None:
    rng = np.random.default_rng(0)
    docs, q = (
        rng.standard_normal((20, 30)).astype(np.float32),
        rng.standard_normal((1, 30)).astype(np.float32),
    )
    cal = Calibration.fixed()
    cd, cq = stored_codes(docs, "binary", cal), stored_codes(q, "binary", cal)
    assert cd.shape == (20, 32)  # 30 dimensions -> 4 bytes -> 32 bits
    hamming = ((docs > 0) != (q > 0)).sum(axis=1)
    assert np.array_equal(np.argsort(-(cd @ cq[0]), kind="stable"), np.argsort(hamming, kind="stable"))


@pytest.mark.parametrize("kind", ["int8", "binary"])
def test_compressed_index_has_its_own_schema(store: Store, chunker: Chunker, kind: str) -> None:
    words = WordEmbedder(chunker.tokenizer)
    comp = QuantizingEmbedder(CenteredWords(chunker.tokenizer), kind, Calibration.fixed())
    type_key = "int8@fixed:1.0" if kind == "int8" else kind
    assert comp.meta.embedding_schema == compressed_schema("es1-words", type_key)
    index_documents(DOCS, comp, store, chunker, progress=False)
    hits = search(store, comp, ["shock wave"], k=2)[0]
    assert all(h.doc_id in ("doc-2", "doc-6") for h in hits)
    with pytest.raises(SchemaMismatchError):  # float queries never search compressed vectors
        search(store, words, ["shock wave"])


def test_spec_builds_the_compressed_embedder(qwen3_dir: Path) -> None:
    options = EngineOptions(max_model_len=128)
    spec = EmbedderSpec(model=str(qwen3_dir), engine=options, embedding_type="binary")
    emb = build_embedder(spec)
    try:
        assert (
            isinstance(emb, QuantizingEmbedder)
            and emb.meta.embedding_schema != emb.inner.meta.embedding_schema
        )
        v = emb.embed_queries(["what is lift"])
        assert set(np.unique(v)) <= {-1.0, 1.0}
    finally:
        emb.close()


def test_a_reranker_cannot_index(tmp_path: Path) -> None:
    from embedserve.errors import ModelLoadError
    from tests.helpers.tiny_rerankers import build_cross_encoder

    model = build_cross_encoder(tmp_path / "ce", "bert")
    with pytest.raises(ModelLoadError, match="reranker"):
        build_embedder(EmbedderSpec(model=str(model), engine=EngineOptions(max_model_len=128)))


def test_decoded_int8_is_within_half_a_step() -> None:
    from embedserve.index.quantized import decoded

    rng = np.random.default_rng(1)
    v = rng.uniform(-0.9, 0.9, (10, 16)).astype(np.float32)
    cal = Calibration.fixed()
    for kind in ("int8", "uint8"):
        back = decoded(stored_codes(v, kind, cal), kind, cal)
        assert np.abs(back - v).max() <= (2 / 255) / 2 + 1e-6


@pytest.mark.parametrize("kind", ["int8", "binary"])
def test_rescored_search(store: Store, chunker: Chunker, kind: str) -> None:
    from embedserve.errors import InvalidInputError

    comp = QuantizingEmbedder(CenteredWords(chunker.tokenizer), kind, Calibration.fixed())
    index_documents(DOCS, comp, store, chunker, progress=False)
    hits = search(store, comp, ["shock wave"], k=2, rescore=8)[0]
    assert {h.doc_id for h in hits} <= {"doc-2", "doc-6"} and len(hits) == 2
    assert hits[0].score >= hits[1].score and hits[0].vector is None
    with pytest.raises(InvalidInputError, match="compressed"):
        search(store, CenteredWords(chunker.tokenizer, comp.meta.embedding_schema), ["x"], rescore=8)
