"""quantization="int8-weights" (models/weight_int8.py, engine/quantize.py): a GGUF's Q8_0
projections are kept as stored and give the float32 engine's vectors on that file (bit for bit
on short steps, which run natively); a float model is rounded to Q8_0 and stays within the gate
of sentence-transformers / transformers float32; its own schema and profile; refusals by name."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.engine import quantize
from embedserve.engine.builder import build_engine
from embedserve.engine.engine import Engine
from embedserve.errors import ModelLoadError
from embedserve.kernels import weight_int8
from embedserve.models.linear import Linear
from embedserve.schema import ModelMetadata
from tests.helpers.cpu import short_rows_dtypes
from tests.helpers.real_text import documents
from tests.helpers.reference import cosine, hf_embed_ids, random_ids, st_embed
from tests.helpers.short_steps import record_short_steps
from tests.helpers.tiny_bert import minilm_dir
from tests.helpers.tiny_gguf import build_gguf_pair, train_tokenizer
from tests.helpers.tiny_models import build_decoder

FLOAT32 = [p for p in short_rows_dtypes() if p.values[0] == torch.float32]


def _projections(engine: Engine) -> list[Linear]:
    return [m for m in engine._loop.parts.core.runner.model.modules() if isinstance(m, Linear)]


@pytest.fixture(scope="module")
def q8_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf")
    root = tmp_path_factory.mktemp("q8")
    return build_gguf_pair(root, "qwen3", train_tokenizer(), q8_0=True)[1]


@pytest.mark.parametrize("dtype", FLOAT32)
def test_a_q8_0_gguf_is_served_as_stored_with_float32s_vectors(
    q8_file: Path, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = record_short_steps(monkeypatch)
    short = [random_ids(n, seed=n, vocab=700) for n in (3, 9, 16)]  # the GGUF's trained vocabulary
    long = [random_ids(n, seed=n, vocab=700) for n in (90, 200)]
    with Engine.from_pretrained(q8_file) as fp32:
        want_short = np.stack([fp32.embed([s])[0] for s in short])
        want_long = fp32.embed(long)
    with Engine.from_pretrained(q8_file, quantization="int8-weights") as w8:
        taken.clear()  # the load's warm-up and probes stepped too
        projections = _projections(w8)
        assert projections and all(m.weights8 is not None and m.weights8.form == "kept" for m in projections)
        got_short = np.stack([w8.embed([s])[0] for s in short])
        assert taken == [True, True, True]  # natively, on the int8-weight kernel
        got_long = w8.embed(long)
        stored = sum(m.weights8.nbytes for m in projections if m.weights8 is not None)
        floats = sum(m.weight.numel() * 4 for m in projections)
    assert np.array_equal(got_short, want_short)  # the file's weights, the same FMAs in the same order
    assert cosine(got_long, want_long).min() >= 0.99999  # oneDNN on the widened weight: float32 rounding
    assert stored < 0.3 * floats  # int8 values and a scale per 32: 1.125 bytes a weight


def test_a_float_decoder_rounds_to_q8_0_within_the_gate(tmp_path: Path) -> None:
    model = build_decoder(tmp_path / "dec", hidden=128, layers=2, std=0.1)
    seqs = [random_ids(n, seed=n) for n in (5, 40, 150)]
    want = hf_embed_ids(model, seqs)
    for options in ({}, {"max_num_batched_tokens": 64, "layer_major_tokens": 0}):  # whole, chunked
        with Engine.from_pretrained(model, quantization="int8-weights", **options) as engine:
            assert all(m.weights8 is not None for m in _projections(engine))
            c = cosine(engine.embed(seqs), want)
        assert 0.999 <= c.min() < 0.999999, (options, c)  # close to float32, and int8 weights did run


@pytest.fixture(scope="module")
def minilm_w8() -> Engine:
    engine = Engine.from_pretrained(minilm_dir(), quantization="int8-weights")
    yield engine
    engine.close()


def test_minilm_int8_weights_stays_within_the_gate_of_sentence_transformers(minilm_w8: Engine) -> None:
    texts = [d[: 200 + 37 * i] for i, d in enumerate(documents()[:24])]
    c = cosine(minilm_w8.embed(texts, truncate="end"), st_embed(minilm_dir(), texts))
    assert np.percentile(c, 1) >= 0.999 and c.min() >= 0.995, (np.percentile(c, 1), c.min())
    assert c.min() < 0.99999  # rounded weights really ran: float32 gives 1.00000 here


def test_int8_weight_vectors_have_their_own_schema_and_profile(minilm_w8: Engine) -> None:
    fp32 = build_engine(minilm_dir()).config
    w8 = minilm_w8._loop.parts.config
    meta8, meta32 = (ModelMetadata.from_engine_config(c, "m", None, "f") for c in (w8, fp32))
    assert meta8.backend_profile == "cpu-fp32-int8-weights" and meta32.backend_profile == "cpu-fp32"
    assert meta8.schema() != meta32.schema()


def test_the_gate_refuses_naming_the_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantize, "MIN_COSINE", 1.01)
    with pytest.raises(
        ModelLoadError,
        match=r"'int8-weights' drifts .* lowest cosine of 18 probe vectors is 0\.99\d+ .*gate 1\.01",
    ):
        build_engine(minilm_dir(), quantization="int8-weights")


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"dtype": "bfloat16"}, "computes in float32: dtype must be float32"),
        ({"enable_lora": True}, "does not combine with LoRA adapters"),
        ({"deterministic": True}, "does not combine with deterministic mode"),
    ],
)
def test_combinations_it_does_not_take_are_refused_by_name(options: dict[str, object], names: str) -> None:
    with pytest.raises(ModelLoadError, match=f"quantization='int8-weights' {names}"):
        build_engine(minilm_dir(), quantization="int8-weights", **options)


def test_a_model_with_other_outputs_is_refused(tmp_path: Path) -> None:
    from tests.helpers.tiny_sparse import build_splade

    with pytest.raises(
        ModelLoadError, match="'int8-weights' serves dense embedding models; this model emits sparse"
    ):
        build_engine(build_splade(tmp_path / "splade"), quantization="int8-weights")


def test_it_runs_without_int8_dot_products_or_its_kernel(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """No VNNI needed (float32 arithmetic); without the kernel, every step widens the weight."""
    monkeypatch.setattr(quantize.isa, "int8_dot_products", lambda: False)
    monkeypatch.setattr(weight_int8, "available", lambda: False)
    model = build_decoder(tmp_path / "dec", hidden=128, layers=2, std=0.1)
    seqs = [random_ids(n, seed=n) for n in (4, 30)]
    quiet = caplog.at_level(logging.INFO, logger="embedserve.engine.quantize")
    with quiet, Engine.from_pretrained(model, quantization="int8-weights") as engine:
        assert engine._loop.parts.config.quantization == "int8-weights"
        assert engine._loop.parts.core.runner.model.short_path is None
        c = cosine(engine.embed(seqs), hf_embed_ids(model, seqs))
    assert c.min() >= 0.999
    assert "short rows on weights widened per call (no kernel here)" in caplog.text
