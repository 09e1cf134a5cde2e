"""oneDNN linear: same results as F.linear, with the weight packed once, used only where it applies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional

from embedserve import Engine
from embedserve.engine.builder import build_engine
from embedserve.models import linear
from embedserve.models.linear import Linear, prepack
from tests.helpers.reference import random_ids

FP32_OK = linear.onednn_available(torch.float32)
BF16_OK = linear.onednn_available(torch.bfloat16)
DTYPES = [
    pytest.param(torch.float32, marks=pytest.mark.skipif(not FP32_OK, reason="no oneDNN fp32 linear")),
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(not BF16_OK, reason="no oneDNN bf16 linear")),
]


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}


@pytest.mark.skipif(not FP32_OK, reason="no oneDNN linear in this torch")
@pytest.mark.parametrize(("rows", "bias"), [(1, True), (300, False), (2048, True)])
def test_fp32_equals_f_linear(rows: int, bias: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = linear._onednn_linear

    def counted(*args: torch.Tensor | None) -> torch.Tensor:
        calls.append(1)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(linear, "_onednn_linear", counted)
    torch.manual_seed(rows)
    layer = Linear(96, 160, bias=bias)
    x = torch.randn(rows, 96)
    got = layer(x)
    assert calls == [1]
    torch.testing.assert_close(got, functional.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_packed_weight_gives_the_plain_result_at_every_row_count(dtype: torch.dtype, bias: bool) -> None:
    torch.manual_seed(3)
    layer = Linear(192, 320, bias=bias).to(dtype)
    plain_w = layer.weight.detach().clone()
    plain_b = None if layer.bias is None else layer.bias.detach().clone()
    xs = {rows: torch.randn(rows, 192, dtype=dtype) for rows in (1, 2, 7, 64, 65, 513, 2048)}
    want = {rows: linear._onednn_linear(x, plain_w, plain_b) for rows, x in xs.items()}
    assert layer.prepack()
    assert layer.weight.is_mkldnn and tuple(layer.weight.shape) == (320, 192)
    assert not layer.prepack()  # packed once
    for rows, x in xs.items():
        got = layer(x)
        assert got.dtype == dtype and got.shape == (rows, 320)
        if dtype == torch.bfloat16:  # the same oneDNN kernel on the same bytes
            assert torch.equal(got, want[rows]), rows
        else:  # one row may take a different summation order
            torch.testing.assert_close(got, want[rows], rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(got.float(), functional.linear(x, plain_w, plain_b).float(), **_tol(dtype))
    # packed rows of any leading shape, e.g. [batch, seq, hidden] in an encoder
    x3 = torch.randn(2, 5, 192, dtype=dtype)
    torch.testing.assert_close(layer(x3), layer(x3.reshape(10, 192)).reshape(2, 5, 320))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_other_dtypes_are_not_packed_and_keep_f_linear(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(linear, "_onednn_linear", lambda *a: pytest.fail("oneDNN path taken"))
    layer = Linear(8, 4).to(dtype)
    before = layer.weight
    assert not layer.prepack()
    assert layer.weight is before
    x = torch.randn(3, 8, dtype=dtype)
    torch.testing.assert_close(layer(x), functional.linear(x, layer.weight, layer.bias))


def test_unpacked_bf16_keeps_f_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "_onednn_linear", lambda *a: pytest.fail("oneDNN path taken"))
    layer = Linear(8, 4).to(torch.bfloat16)
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    torch.testing.assert_close(layer(x), functional.linear(x, layer.weight, layer.bias))


def test_meta_weights_are_not_packed() -> None:
    with torch.device("meta"):
        layer = Linear(8, 4)
    assert not layer.prepack()
    assert layer.weight.device.type == "meta"


def test_a_missing_op_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "_POINTWISE", None)
    linear.onednn_available.cache_clear()
    try:
        assert not linear.onednn_available(torch.float32)
        assert not linear.onednn_available(torch.bfloat16)
        layer = Linear(8, 4)
        assert not layer.prepack() and not layer.weight.is_mkldnn
        x = torch.randn(3, 8)
        torch.testing.assert_close(layer(x), functional.linear(x, layer.weight, layer.bias))
    finally:
        linear.onednn_available.cache_clear()


def test_a_wrong_packed_result_turns_onednn_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "_REORDER", lambda w, rows: torch.zeros_like(w))
    linear.onednn_available.cache_clear()
    try:
        assert not linear.onednn_available(torch.float32)
        assert not Linear(8, 4).prepack()
    finally:
        linear.onednn_available.cache_clear()


def test_prepack_walks_the_model_and_reports_each_weight() -> None:
    model = torch.nn.Sequential(
        Linear(8, 16), torch.nn.ReLU(), Linear(16, 4, bias=False), torch.nn.Linear(4, 2)
    )
    released: list[int] = []
    assert prepack(model, lambda: released.append(1)) == (2 if FP32_OK else 0)
    assert len(released) == (2 if FP32_OK else 0)
    assert not model[3].weight.is_mkldnn  # a plain nn.Linear is not ours to pack
    assert prepack(model) == 0


def _linears(parts_model: torch.nn.Module) -> list[Linear]:
    return [m for m in parts_model.modules() if isinstance(m, Linear)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_engines_pack_every_projection_and_vectors_do_not_change(
    qwen3_dir: Path, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not linear.onednn_available(getattr(torch, dtype)):
        pytest.skip("no oneDNN linear for this dtype")
    seqs = [random_ids(n, seed=n) for n in (1, 9, 300)]
    vectors = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("EMBEDSERVE_PREPACK", flag)
        parts = build_engine(qwen3_dir, dtype=dtype, max_num_batched_tokens=128, kv_cache_memory=1 << 22)
        layers = _linears(parts.core.runner.model)
        assert layers and all(layer.weight.is_mkldnn == (flag == "1") for layer in layers)
        with Engine(parts) as engine:
            vectors[flag] = engine.embed(seqs)
    cos = np.sum(vectors["0"] * vectors["1"], axis=1)
    assert cos.min() > (0.99999 if dtype == "float32" else 0.9995), cos
