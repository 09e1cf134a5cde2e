"""Real trained embedders: EmbeddingGemma-300M and all-mpnet-base-v2 against sentence-transformers,
and the scores EmbeddingGemma's own notebook saved upstream.

The weights are fetched, not installed: `bash ../shared/tools/realmodels/fetch.sh DIR`, then
`EMBEDSERVE_REAL_MODELS=DIR python -m pytest tests/unit/models/test_real_embedders.py`. Without them
every test here skips, naming the directory it looked for.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from tests.helpers.engine_calls import embed_outputs
from tests.helpers.real_text import long_text
from tests.helpers.reference import cosine, st_model

ROOT = Path(os.environ.get("EMBEDSERVE_REAL_MODELS", "/nonexistent-embedserve-real-models"))
GEMMA, MPNET = ROOT / "embeddinggemma-300m", ROOT / "all-mpnet-base-v2"
PAIRS = [
    (
        "The chef prepared a delicious meal for the guests.",
        "A tasty dinner was cooked by the chef for the visitors.",
    ),
    ("She is an expert in machine learning.", "He has a deep interest in artificial intelligence."),
    ("The weather in Tokyo is sunny today.", "I need to buy groceries for the week."),
]
# upstream's notebook.ipynb (CUDA): (prompt_name, truncate_dim) -> the three pairs' cosines, or
# the words' ("apple" vs "banana", "car")
NOTEBOOK_PAIRS = {
    (None, None): [0.8002148, 0.45417833, 0.22262995],
    ("STS", None): [0.9363755, 0.6425841, 0.38587403],
}
NOTEBOOK_WORDS = {
    ("STS", None): [0.75102395, 0.6684626],
    ("STS", 512): [0.767427, 0.7040509],  # its cell's printed scores are the STS prompt's
    ("STS", 256): [0.7854644, 0.7382126],
}


def need(path: Path) -> None:
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"real weights not at {path} (set EMBEDSERVE_REAL_MODELS; fetch.sh DIR)")


def mixed(limit_words: int) -> list[str]:
    """Short and long texts in one batch, the longest cut near the model's limit by truncate='end'."""
    words = long_text(40_000).split()
    return [PAIRS[0][0], words[0], " ".join(words[:40]), " ".join(words[: limit_words // 4]),
            " ".join(words[:limit_words]), PAIRS[1][1], " ".join(words[:300])]  # fmt: skip


@pytest.fixture(scope="module")
def gemma() -> Engine:
    need(GEMMA)
    with Engine.from_pretrained(GEMMA) as engine:
        yield engine  # type: ignore[misc]


@pytest.mark.parametrize("prompt_name", ["query", "document", "STS"])
def test_embeddinggemma_matches_sentence_transformers(gemma: Engine, prompt_name: str) -> None:
    batch = mixed(3000)  # the longest is cut to 2,048 tokens on both sides
    ref = st_model(str(GEMMA)).encode(batch, prompt_name=prompt_name, batch_size=4)
    outs = embed_outputs(gemma, batch, prompt_name=prompt_name, truncate="end")
    assert max(o.num_tokens for o in outs) == 2048
    assert cosine(np.stack([o.embedding for o in outs]), ref).min() >= 0.99999


def test_embeddinggemma_reproduces_the_notebooks_scores(gemma: Engine) -> None:
    for (prompt_name, _), want in NOTEBOOK_PAIRS.items():
        got = [float(np.dot(*gemma.embed(list(pair), prompt_name=prompt_name))) for pair in PAIRS]
        np.testing.assert_allclose(got, want, atol=2e-5)
    for (prompt_name, dims), want in NOTEBOOK_WORDS.items():
        v = gemma.embed(["apple", "banana", "car"], prompt_name=prompt_name, dimensions=dims)
        np.testing.assert_allclose([v[0] @ v[1], v[0] @ v[2]], want, atol=2e-5)


@pytest.mark.parametrize("dims", [768, 512, 256, 128])
def test_embeddinggemma_matryoshka_equals_truncate_dim(gemma: Engine, dims: int) -> None:
    batch = mixed(600)
    ref = st_model(str(GEMMA)).encode(batch, prompt_name="query", truncate_dim=dims, batch_size=4)
    got = gemma.embed(batch, prompt_name="query", dimensions=dims)
    assert got.shape == (len(batch), dims)
    assert cosine(got, ref).min() >= 0.99999


def test_embeddinggemma_bf16(gemma: Engine) -> None:
    batch = mixed(2000)
    ref = gemma.embed(batch, prompt_name="document", truncate="end")  # fp32 == ST (above)
    with Engine.from_pretrained(GEMMA, dtype="bfloat16") as engine:
        got = engine.embed(batch, prompt_name="document", truncate="end")
    assert np.quantile(cosine(got, ref), 0.01) >= 0.999


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mpnet_matches_sentence_transformers(dtype: str) -> None:
    need(MPNET)
    batch = mixed(500)  # the longest is cut to 384 tokens on both sides
    ref = st_model(str(MPNET)).encode(batch, batch_size=4)
    with Engine.from_pretrained(MPNET, dtype=dtype) as engine:
        outs = embed_outputs(engine, batch, truncate="end")
    assert max(o.num_tokens for o in outs) == 384
    cos = cosine(np.stack([o.embedding for o in outs]), ref)
    if dtype == "float32":
        assert cos.min() >= 0.99999
    else:
        assert np.quantile(cos, 0.01) >= 0.999
