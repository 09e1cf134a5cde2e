"""Real EmbeddingGemma-300M as a `gemma-embedding` GGUF (written from the fetched directory the
way llama.cpp's converter writes it): its SentencePiece vocabulary against the real
tokenizer.json, its vectors against sentence-transformers on the directory.

Skips, naming the directory, without `EMBEDSERVE_REAL_MODELS` (see test_real_embedders.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from embedserve import Engine
from embedserve.models.gguf_vocab import sentencepiece_tokenizer
from tests.helpers.gguf_encoders import sentencepiece_metadata, write_encoder_gguf
from tests.helpers.real_text import long_text
from tests.helpers.reference import cosine, st_model
from tests.unit.models.test_gguf_vocab import SAMPLES
from tests.unit.models.test_real_embedders import GEMMA, PAIRS, need

QUERY = "task: search result | query: "  # EmbeddingGemma's "query" prompt, written into the text
MIN_COSINE = {"f32": 0.99999, "q8_0": 0.999}


def test_embeddinggemma_gguf_vocabulary_equals_its_tokenizer_json() -> None:
    need(GEMMA)
    m = sentencepiece_metadata(GEMMA)
    meta = {
        "tokenizer.ggml.tokens": m["tokens"], "tokenizer.ggml.token_type": m["types"],
        "tokenizer.ggml.scores": m["scores"], "tokenizer.ggml.bos_token_id": m["bos"],
        "tokenizer.ggml.eos_token_id": m["eos"], "tokenizer.ggml.unknown_token_id": m["unk"],
        "tokenizer.ggml.add_bos_token": m["add_bos"], "tokenizer.ggml.add_eos_token": m["add_eos"],
        "tokenizer.ggml.add_space_prefix": False,
    }  # fmt: skip
    ours = sentencepiece_tokenizer(lambda key, default=None: meta.get(key, default))
    ref = Tokenizer.from_file(str(GEMMA / "tokenizer.json"))
    for text in [*SAMPLES, "<b>bold</b> <div class='x'>", "<unused5> <mask> [multimodal]", long_text(20_000)]:
        assert ours.encode(text).ids == ref.encode(text).ids, text[:80]
    assert ours.encode("q", "d").ids == ref.encode("q", "d").ids


@pytest.mark.parametrize("qtype", ["f32", "q8_0"])
def test_embeddinggemma_gguf_matches_sentence_transformers(tmp_path: Path, qtype: str) -> None:
    need(GEMMA)
    gguf_file = write_encoder_gguf(tmp_path / f"embeddinggemma-{qtype}.gguf", GEMMA, "gemma-embedding", qtype)
    words = long_text(40_000).split()
    batch = [PAIRS[0][0], words[0], " ".join(words[:600]), PAIRS[1][1], " ".join(words[:1500])]
    with Engine.from_pretrained(gguf_file) as engine:
        assert engine.config.vector_size == 768
        got = engine.embed([QUERY + t for t in batch])
    ref = np.asarray(st_model(str(GEMMA)).encode(batch, prompt_name="query", normalize_embeddings=True))
    sims = cosine(got, ref)
    print(f"EmbeddingGemma GGUF {qtype}: min cosine {sims.min():.6f} to sentence-transformers fp32")
    assert sims.min() >= MIN_COSINE[qtype], sims
