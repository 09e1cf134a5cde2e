"""oneDNN float32 linear: same results as F.linear, used only where it applies."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from embedserve.models import linear
from embedserve.models.linear import Linear


@pytest.mark.skipif(not linear.onednn_fp32_available(), reason="no oneDNN linear in this torch")
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_other_dtypes_keep_f_linear(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "_onednn_linear", lambda *a: pytest.fail("oneDNN fp32 path taken"))
    layer = Linear(8, 4).to(dtype)
    x = torch.randn(3, 8, dtype=dtype)
    torch.testing.assert_close(layer(x), functional.linear(x, layer.weight, layer.bias))


def test_a_missing_op_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "_POINTWISE", None)
    linear.onednn_fp32_available.cache_clear()
    try:
        assert not linear.onednn_fp32_available()
        layer = Linear(8, 4)
        x = torch.randn(3, 8)
        torch.testing.assert_close(layer(x), functional.linear(x, layer.weight, layer.bias))
    finally:
        linear.onednn_fp32_available.cache_clear()
