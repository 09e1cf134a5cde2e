"""quantization="int8" (models/int8_linear.py, engine/quantize.py): the int8 projection equals an
exact integer emulation of its arithmetic; all-MiniLM-L6-v2 in int8 stays within the gate of
sentence-transformers' float32 vectors; a request's bytes do not depend on its batch; the probe
gate refuses a model by its figure; options it does not combine with are refused by name."""

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
from embedserve.kernels import int8_rows, int8_short, isa
from embedserve.models.int8_linear import int8_available
from embedserve.models.linear import Linear
from embedserve.schema import ModelMetadata
from embedserve.settings import settings
from tests.helpers.real_text import documents
from tests.helpers.reference import cosine, random_ids, st_embed
from tests.helpers.tiny_bert import minilm_dir
from tests.helpers.tiny_models import build_decoder

pytestmark = pytest.mark.skipif(
    int8_available() is not None, reason=f"no oneDNN int8 linear: {int8_available()}"
)


def _emulated(layer: Linear, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The int8 path's arithmetic in float64 from its own definition: per-token asymmetric 7-bit
    activations over the inlier channels, per-channel symmetric 8-bit weights, outliers exact."""
    w8 = layer.int8
    assert w8 is not None
    out = w8.outliers
    xd, wd = x.double(), weight.double()
    inl = xd.clone()
    inl[:, out] = 0
    lo, hi = inl.min(1).values.clamp(max=0), inl.max(1).values.clamp(min=0)
    s = ((hi - lo) / 127).clamp(min=1e-30).float().double()  # the scale is a float32
    z = torch.round(-(lo.float() / s.float())).double()
    q = torch.clamp(torch.round((inl.float() / s.float()[:, None]).double() + z[:, None]), 0, 127)
    w_in = wd.clone()
    w_in[:, out] = 0
    ws = (w_in.abs().amax(1) / 127).float().double()
    wq = torch.clamp(torch.round(w_in.float() / ws.float()[:, None]), -127, 127).double()
    return (s[:, None] * ((q - z[:, None]) @ wq.T) * ws) + xd[:, out] @ wd[:, out].T + bias.double()


@pytest.mark.parametrize("rows", [1, 7, 70])
def test_the_int8_projection_is_its_integer_arithmetic(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    layer = Linear(96, 80)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    x = torch.randn(rows, 96, generator=gen)
    x[:, [3, 50]] *= 40  # two outlier channels, which calibration finds
    layer.to_int8(x.abs().amax(0))
    assert layer.int8 is not None and {3, 50} <= set(layer.int8.outliers.tolist())
    with torch.no_grad():
        got, padded = layer(x), layer.padded(x)
    want = _emulated(layer, x, weight, bias)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-4)
    assert torch.equal(padded[:rows], got)  # padding rows change no real row
    assert (
        layer.weight.shape == (80, 96) and layer.weight.untyped_storage().nbytes() <= 4
    )  # the float weight is gone


@pytest.mark.parametrize("width", [384, 100])  # 100: the kernel's tail past whole vectors
def test_native_rows_equal_the_pytorch_ops(width: int) -> None:
    if not int8_rows.native_ok():
        pytest.skip("the native int8_rows kernel did not build here (no C++ compiler)")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(300, width, generator=gen) * 3
    x[4] = 0.0  # a row of zeros
    outliers = torch.tensor([0, 7, width - 1])
    mask = torch.zeros(width, dtype=torch.uint8).index_fill_(0, outliers, 1)
    native, ops = int8_rows.quantize_rows(x, mask, outliers), int8_rows._quantize_torch(x, mask, outliers)
    assert all(torch.equal(a, b) for a, b in zip(native, ops, strict=True))


def _texts() -> list[str]:
    return [d[: 200 + 37 * i] for i, d in enumerate(documents()[:24])]


@pytest.fixture(scope="module")
def minilm_int8() -> Engine:
    engine = Engine.from_pretrained(minilm_dir(), quantization="int8")
    yield engine
    engine.close()


def test_minilm_int8_stays_within_the_gate_of_sentence_transformers(minilm_int8: Engine) -> None:
    texts = _texts()
    got = minilm_int8.embed(texts, truncate="end")
    c = cosine(got, st_embed(minilm_dir(), texts))
    assert np.percentile(c, 1) >= 0.999 and c.min() >= 0.995, (np.percentile(c, 1), c.min())
    assert c.min() < 0.99999  # int8 really ran: float32 gives 1.00000 here


def test_a_rows_bytes_do_not_depend_on_its_batch(minilm_int8: Engine) -> None:
    texts = _texts()
    together = minilm_int8.embed(texts, truncate="end")
    alone = np.stack([minilm_int8.embed([t], truncate="end")[0] for t in texts[:4]])
    assert np.array_equal(together[:4], alone)


def test_int8_vectors_have_their_own_schema_and_profile(minilm_int8: Engine) -> None:
    fp32 = build_engine(minilm_dir()).config
    int8 = minilm_int8._loop.parts.config
    meta8, meta32 = (ModelMetadata.from_engine_config(c, "m", None, "f") for c in (int8, fp32))
    assert meta8.backend_profile == "cpu-fp32-int8" and meta32.backend_profile == "cpu-fp32"
    assert meta8.schema() != meta32.schema()


def test_the_probe_leaves_the_serving_core_untouched(tmp_path: Path) -> None:
    model = build_decoder(tmp_path / "dec", hidden=128, layers=2, std=0.1)
    core = build_engine(model, quantization="int8", enable_prefix_caching=True).core
    kv = core.scheduler.kv
    assert kv.prefix_caching and kv.hit_tokens == 0 and kv.query_tokens == 0
    assert core.num_steps == 0 and not core.has_work


@pytest.mark.parametrize("options", [{}, {"max_num_batched_tokens": 64, "layer_major_tokens": 0}])
def test_a_decoder_runs_int8_chunked_or_whole(tmp_path: Path, options: dict[str, int]) -> None:
    """64-token steps: a prompt's first chunks pool no row, so the last layer's projections
    run on zero rows (calibration and int8 alike)."""
    model = build_decoder(tmp_path / "dec", hidden=128, layers=2, std=0.1)
    ids = [random_ids(40 + 37 * i, seed=i) for i in range(6)]
    engine, fp32 = (
        Engine.from_pretrained(model, quantization="int8", **options),
        Engine.from_pretrained(model),
    )
    try:
        c = cosine(engine.embed(ids), fp32.embed(ids))
    finally:
        engine.close()
        fp32.close()
    assert 0.995 <= c.min() < 0.99999, c  # close to float32, and int8 did run


def test_the_probe_gate_refuses_a_model_naming_its_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantize, "MIN_COSINE", 1.01)
    with pytest.raises(
        ModelLoadError, match=r"lowest cosine of 18 probe vectors is 0\.99\d+ .*below the gate 1\.01"
    ):
        build_engine(minilm_dir(), quantization="int8")


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"dtype": "bfloat16"}, "dtype must be float32"),
        ({"enable_lora": True}, "does not combine with LoRA adapters"),
        ({"compile_backend": "inductor"}, "compile_backend"),
    ],
)
def test_combinations_it_does_not_take_are_refused_by_name(options: dict[str, object], names: str) -> None:
    with pytest.raises(ModelLoadError, match=f"quantization='int8' .*{names}"):
        build_engine(minilm_dir(), quantization="int8", **options)


def test_a_model_with_other_outputs_is_refused(tmp_path: Path) -> None:
    from tests.helpers.tiny_sparse import build_splade

    with pytest.raises(ModelLoadError, match="serves dense embedding models; this model emits sparse"):
        build_engine(build_splade(tmp_path / "splade"), quantization="int8")


def test_without_oneDNN_int8_it_says_so_and_runs_float32(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(quantize, "int8_available", lambda: "no int8 here")
    with caplog.at_level(logging.WARNING, logger="embedserve.engine.quantize"):
        config = build_engine(minilm_dir(), quantization="int8").config
    assert config.quantization is None
    assert "quantization='int8' falls back to float32: no int8 here" in caplog.text


def test_without_int8_dot_products_it_says_so_and_runs_float32(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(isa, "int8_dot_products", lambda: False)
    monkeypatch.setenv("EMBEDSERVE_CPU_INT8", "0")
    settings.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="embedserve.engine.quantize"):
            config = build_engine(minilm_dir(), quantization="int8").config
        assert config.quantization is None
        assert "falls back to float32: this CPU has no int8 dot products (VNNI, AMX-INT8" in caplog.text
        assert "EMBEDSERVE_CPU_INT8=1 runs int8 anyway" in caplog.text
        monkeypatch.setattr(isa, "int8_dot_products", lambda: True)  # a VNNI CPU: int8, no warning
        caplog.clear()
        assert build_engine(minilm_dir(), quantization="int8").config.quantization == "int8"
        assert "falls back" not in caplog.text
    finally:
        settings.cache_clear()


@pytest.mark.skipif(
    not int8_short.available(), reason="the int8 short-rows kernel did not build or check here"
)
@pytest.mark.parametrize(("n", "k", "rows"), [(64, 96, 1), (384, 384, 2), (1536, 384, 5), (640, 2048, 32)])
def test_short_rows_kernel_gives_onednns_bytes(n: int, k: int, rows: int) -> None:
    gen = torch.Generator().manual_seed(n + rows)
    layer = Linear(k, n)
    x = torch.randn(rows, k, generator=gen) * torch.rand(rows, 1, generator=gen) * 3
    x[:, [1, k // 2]] *= 40
    layer.to_int8(x.abs().amax(0))
    w8 = layer.int8
    assert w8 is not None and w8.short  # the weight takes the kernel (its layout checked)
    q = int8_rows.quantize_rows(x, w8.mask, w8.outliers)
    want = int8_rows.finish_rows(
        int8_short.onednn_sums(q.q, w8.packed, w8.w_scale, w8.w_zero), q, w8.zero_fix, w8.bias, w8.w_out
    )
    assert torch.equal(int8_short.linear(q, w8.packed, w8.w_scale, w8.zero_fix, w8.bias, w8.w_out), want)
    with torch.no_grad():
        assert torch.equal(layer(x), want)  # the projection takes it at this row count


def test_a_short_querys_bytes_are_those_of_a_long_step(minilm_int8: Engine) -> None:
    """Queries of a few tokens run every projection on the short-rows kernel alone, and inside a
    batch of long texts on oneDNN: the same bytes either way."""
    queries = ["what is heat transfer", "supersonic flow over a plate", "boundary layer"]
    alone = np.stack([minilm_int8.embed([q])[0] for q in queries])
    together = minilm_int8.embed([*queries, *_texts()[:6]], truncate="end")[: len(queries)]
    assert np.array_equal(alone, together)


def test_the_int8_gate_profile_bounds_what_the_issue_asks() -> None:
    from embedserve.parity.gate import Gate

    bounds = Gate.load(None, "int8").thresholds("overall")
    assert bounds["vector_cosine"] == {"p50": 0.999, "p01": 0.999, "min": 0.995}
    assert bounds["ndcg_at_10"] == {"regression_max": 0.005}
    assert bounds["retrieval_recall"] == {"regression_max": 0.005}
