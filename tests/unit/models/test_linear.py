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
from embedserve.models.linear import Linear, SiluGateUp
from embedserve.models.packing import prepack
from embedserve.settings import settings
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
    """Where the CPU multiplies bf16 (else: test_bf16_without_a_onednn_bf16_matmul_runs_...)."""
    monkeypatch.setattr(linear, "bf16_matmuls", lambda: True)
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


def _silu_gate_up_reference(x: torch.Tensor, w: torch.Tensor, intermediate: int) -> torch.Tensor:
    gate, up = functional.linear(x.double(), w.double()).split(intermediate, dim=-1)
    return functional.silu(gate) * up


@pytest.mark.parametrize("dtype", DTYPES)
@torch.inference_mode()  # as the engine runs: silu and product in place
def test_silu_gate_up_packed_as_two_fused_matmuls(dtype: torch.dtype) -> None:
    torch.manual_seed(5)
    layer = SiluGateUp(96, 80).to(dtype)
    w = layer.weight.detach().clone()
    xs = [torch.randn(rows, 96, dtype=dtype) for rows in (1, 7, 300)]
    plain = [layer(x) for x in xs]  # one matmul, silu and product in place: a strided view
    assert plain[0].shape == (1, 80) and not plain[2].is_contiguous()
    if not linear.onednn_gated_available(dtype):
        pytest.skip("no oneDNN silu / product epilogues here")
    assert layer.prepack()
    assert not layer.prepack()
    assert layer.gate is not None and layer.up is not None
    assert layer.gate.is_mkldnn and layer.up.is_mkldnn and layer.weight.numel() == 0  # no [G; U] copy
    for x, before in zip(xs, plain, strict=True):
        got = layer(x)
        assert got.shape == before.shape and got.dtype == dtype and got.is_contiguous()
        want = _silu_gate_up_reference(x, w, 80)
        if dtype == torch.float32:
            torch.testing.assert_close(got, before, rtol=1e-5, atol=1e-5)
        else:  # silu and product on fp32 accumulators: one rounding instead of four
            err, err_before = ((t.double() - want).abs().max().item() for t in (got, before))
            assert err <= err_before + 1e-3, (err, err_before)
            torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


@torch.inference_mode()
def test_silu_gate_up_without_epilogues_packs_one_matmul(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "_BINARY", None)
    linear.onednn_gated_available.cache_clear()
    try:
        torch.manual_seed(6)
        layer = SiluGateUp(32, 24)
        x = torch.randn(5, 32)
        want = _silu_gate_up_reference(x, layer.weight.detach(), 24).float()
        assert not linear.onednn_gated_available(torch.float32)
        assert layer.prepack() == FP32_OK
        assert layer.gate is None and layer.weight.is_mkldnn == FP32_OK
        torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)
    finally:
        linear.onednn_gated_available.cache_clear()


def _packed(model: torch.nn.Module) -> list[bool]:
    """Each projection matrix of the model: packed for oneDNN?"""
    return [
        p.is_mkldnn
        for m in model.modules()
        if isinstance(m, Linear)
        for p in m.parameters(recurse=False)
        if p.dim() == 2
    ]


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
        settings.cache_clear()  # read once per process: re-read for the second engine
        parts = build_engine(qwen3_dir, dtype=dtype, max_num_batched_tokens=128, kv_cache_memory=1 << 22)
        packed = _packed(parts.core.runner.model)
        assert packed and all(p == (flag == "1") for p in packed)
        with Engine(parts) as engine:
            vectors[flag] = engine.embed(seqs)
    cos = np.sum(vectors["0"] * vectors["1"], axis=1)
    assert cos.min() > (0.99999 if dtype == "float32" else 0.9995), cos


@pytest.mark.skipif(not FP32_OK, reason="no oneDNN fp32 linear")
def test_bf16_without_a_onednn_bf16_matmul_runs_its_float32_matmul(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU without bf16 matmuls (AVX2-only, AVX-512 without BF16; EMBEDSERVE_CPU_BF16=1): bf16 rows
    through oneDNN's float32 matmul on their exact values, rounded once; a row alone gives the
    same bits as in a larger call (deterministic mode), the gated MLP too."""
    monkeypatch.setattr(linear, "bf16_matmuls", lambda: False)
    calls: list[int] = []
    run = linear._onednn_linear

    def spy(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(x.shape[0])
        return run(x, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(linear, "_onednn_linear", spy)
    torch.manual_seed(3)
    layer = Linear(96, 80).to(torch.bfloat16)
    assert not layer.prepack()  # bf16 stays plain: no emulated bf16 matmul
    x = torch.randn(81, 96).to(torch.bfloat16)  # oneDNN runs 84 rows (`padded_rows`); 81 come back
    got = layer(x)
    want = (x.float() @ layer.weight.float().T + layer.bias.float()).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == (81, 80) and calls == [84]
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    assert torch.equal(layer(x[:1]), got[:1]) and torch.equal(layer(x[:7]), got[:7])
    assert calls[1:] == [2, 7]  # one row ran as two
    kept = layer.padded(x)  # the padding rows left on for an elementwise op after it
    assert kept.shape == (84, 80) and torch.equal(kept[:81], got)
    mlp = SiluGateUp(96, 64).to(torch.bfloat16)
    both = functional.linear(x.float(), mlp.weight.float())
    want = (functional.silu(both[:, :64]).to(torch.bfloat16).float() * both[:, 64:]).to(torch.bfloat16)
    torch.testing.assert_close(mlp(x).float(), want.float(), rtol=2e-2, atol=2e-2)
