"""The short-rows kernels (bfloat16 on AMX, float32 on AVX-512): oneDNN's results on oneDNN's
packed weights, read in place, only where the packing is the layout they read, and off where
vectors must not depend on the batch."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve import Engine
from embedserve.engine.builder import build_engine
from embedserve.kernels import short_linear
from embedserve.models import linear
from embedserve.models.linear import Linear, SiluGateUp
from embedserve.settings import settings
from tests.helpers.cpu import has, short_rows_dtypes
from tests.helpers.reference import random_ids

POINTWISE = torch.ops.mkldnn._linear_pointwise


DTYPES = short_rows_dtypes()


def _packed(n: int, k: int, seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    plain = (torch.randn(n, k, generator=gen) * 0.05).to(dtype)
    return plain, linear._pack(plain)


def _reads(
    n: int, k: int, seed: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, short_linear.Packed]:
    plain, packed = _packed(n, k, seed, dtype)
    reads = short_linear.reads(plain, packed)
    assert reads is not None
    return plain, packed, reads


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    tol = {"rtol": 1.6e-2, "atol": 1e-2} if got.dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 2e-5}
    torch.testing.assert_close(got.float(), want.float(), **tol)


@pytest.mark.parametrize("dtype", DTYPES)
# the models' fused shapes (SmolLM2's QKV is 960 x 576), and 192 x 576, which oneDNN packs in
# 16-column blocks where its fp32 ISA is AVX2 (then `reads` refuses it and oneDNN keeps the rows)
@pytest.mark.parametrize(
    ("n", "k"), [(64, 32), (4096, 1024), (1024, 3072), (576, 576), (960, 576), (192, 576)]
)
def test_packings_of_model_shapes_are_the_blocks_the_kernel_reads(dtype: torch.dtype, n: int, k: int) -> None:
    onednn_avx2 = not has("avx512f") or os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper().startswith("AVX2")
    if (n, dtype) == (192, torch.float32) and onednn_avx2:
        pytest.skip("oneDNN's AVX2 fp32 packing of N = 192 is 16-column blocks")
    plain, packed = _packed(n, k, seed=n + k, dtype=dtype)
    assert short_linear.packed_as_blocks(plain, packed)
    assert not short_linear.packed_as_blocks(plain.flip(0).contiguous(), packed)  # other bytes: refused


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_replaced_weight_is_never_read_through_the_old_address(dtype: torch.dtype) -> None:
    assert short_linear.available(dtype)
    torch.manual_seed(5)
    layer, other = Linear(256, 320).to(dtype), Linear(256, 320).to(dtype)
    assert layer.prepack(short_rows=True) and other.prepack(short_rows=True) and layer.short is not None
    x = torch.randn(4, 256).to(dtype)
    layer.load_state_dict(other.state_dict(), assign=True)  # the old packed tensor is freed
    assert torch.equal(layer(x), other(x))  # oneDNN on the new weight, not the old bytes
    mlp, new = SiluGateUp(256, 320).to(dtype), SiluGateUp(256, 320).to(dtype)
    assert mlp.prepack(short_rows=True) and new.prepack(short_rows=True)
    mlp.load_state_dict(new.state_dict(), assign=True)
    _close(mlp(x), new(x))  # (fp32: oneDNN against the kernel, one rounding apart)


@pytest.mark.parametrize("dtype", DTYPES)
def test_shapes_off_the_blocks_are_refused(dtype: torch.dtype) -> None:
    for n, k in ((48, 64), (64, 1000)):  # part of a column block; K that oneDNN pads (float32)
        plain, packed = _packed(n, k, seed=1, dtype=dtype)
        assert not short_linear.packed_as_blocks(plain, packed), (n, k)
    _, packed = _packed(48, 64, seed=1, dtype=dtype)
    assert short_linear.reads(_packed(48, 64, seed=1, dtype=dtype)[0], packed) is None
    forced = short_linear.Packed(short_linear.packed_address(packed), dtype, 48, 64, tensor=packed)
    with pytest.raises(RuntimeError, match="code 2"):  # the kernel refuses it too
        short_linear.linear(torch.randn(3, 64).to(dtype), forced)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 15, 16, 17, 32, 40, 64])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("k", [1024, 96, 160, 608])  # a partial last k chunk (fp32), 19 tiles (bf16)
def test_plain_projection_gives_onednns_result(dtype: torch.dtype, rows: int, bias: bool, k: int) -> None:
    plain, packed, reads = _reads(320, k, seed=rows, dtype=dtype)
    b = torch.randn(320).to(dtype) if bias else None
    x = torch.randn(rows, 2 * k).to(dtype)[:, k:]  # rows 2k apart
    got = short_linear.linear(x, reads, b)
    onednn = POINTWISE(x, packed, b, "none", [], "")
    if dtype == torch.bfloat16 and rows <= 32:  # a query's rows: the same sums in the same order
        assert torch.equal(got, onednn)
    elif dtype == torch.bfloat16:  # oneDNN blocks more rows otherwise: an element may round the other way
        assert (got != onednn).float().mean().item() < 1e-3
    else:  # float32: k summed in another order, about one rounding apart
        torch.testing.assert_close(got, onednn, rtol=1e-5, atol=2e-5)
    want = torch.nn.functional.linear(x.double(), plain.double(), None if b is None else b.double())
    _close(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 16, 33])
def test_gated_product_matches_onednns_fused_epilogues(dtype: torch.dtype, rows: int) -> None:
    _, gate, gate_reads = _reads(3072, 1024, seed=10, dtype=dtype)
    _, up, up_reads = _reads(3072, 1024, seed=11, dtype=dtype)
    x = torch.randn(rows, 1024).to(dtype)
    got = short_linear.silu_gate_up(x, gate_reads, up_reads)
    want = POINTWISE.binary(x, POINTWISE(x, gate, None, "swish", [], ""), up, None, "mul")
    if dtype == torch.bfloat16:
        assert (got != want).float().mean().item() < 1e-3  # the exp of silu may round the other way, rarely
    _close(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bad_rows_are_refused_with_a_message(dtype: torch.dtype) -> None:
    _, _, reads = _reads(64, 64, seed=2, dtype=dtype)
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
    for x in (torch.randn(2, 64).to(other), torch.randn(2, 96).to(dtype), torch.randn(2, 2, 64).to(dtype)):
        with pytest.raises(ValueError, match=r"CPU rows \[rows, 64\]"):  # another dtype or width: never read
            short_linear.linear(x, reads)
    with pytest.raises(ValueError, match="bias"):
        short_linear.linear(torch.randn(2, 64).to(dtype), reads, torch.ones(3, dtype=dtype))
    with pytest.raises(ValueError, match="one shape"):
        short_linear.silu_gate_up(
            torch.randn(2, 64).to(dtype), reads, _reads(128, 64, seed=3, dtype=dtype)[2]
        )
    wide = torch.randn(1, 64).to(dtype).expand(3, 64)  # overlapping rows: read as dense copies
    assert torch.equal(short_linear.linear(wide, reads)[2], short_linear.linear(wide[:1], reads)[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_modules_take_the_kernel_for_few_rows_and_onednn_beyond(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = short_linear.linear

    def counted(x: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append(x.shape[0])
        return real(x, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(short_linear, "linear", counted)
    torch.manual_seed(0)
    most = short_linear.MAX_ROWS[dtype]
    layer = Linear(256, 320, bias=True).to(dtype)
    plain = layer.weight.detach().clone()
    assert layer.prepack(short_rows=True) and layer.short is not None
    for rows in (1, most, most + 1):
        x = torch.randn(rows, 256).to(dtype)
        _close(layer(x), POINTWISE(x, linear._pack(plain), layer.bias, "none", [], ""))
    assert calls == [1, most]
    other = Linear(256, 320).to(dtype)
    assert other.prepack() and other.short is None  # off unless asked
    mlp = SiluGateUp(256, 320).to(dtype)
    assert mlp.prepack(short_rows=True) and mlp.short is not None and len(mlp.short) == 2
    x = torch.randn(5, 256).to(dtype)
    assert mlp.gate is not None and mlp.up is not None
    _close(mlp(x), linear._silu_gate_up(x, mlp.gate, mlp.up))


@pytest.mark.parametrize("dtype", DTYPES)
def test_short_queries_through_the_engine_agree_with_onednn_and_deterministic_mode_keeps_it_off(
    qwen3_dir: Path, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    seqs = [random_ids(n, seed=n) for n in (1, 5, 9)]
    vectors = {}
    for mode in ("short", "onednn", "det"):
        monkeypatch.setenv("EMBEDSERVE_SHORT_ROWS", "0" if mode == "onednn" else "1")  # the A/B switch
        settings.cache_clear()  # read once per process: re-read for each engine
        parts = build_engine(
            qwen3_dir, dtype=str(dtype).removeprefix("torch."), max_num_batched_tokens=256,
            kv_cache_memory=1 << 22, deterministic=mode == "det",
        )  # fmt: skip
        reads = [m.short for m in parts.core.runner.model.modules() if isinstance(m, Linear)]
        assert all(r is not None for r in reads) == (mode == "short"), mode
        with Engine(parts) as engine:
            vectors[mode] = np.stack([engine.embed([s])[0] for s in seqs])  # one short query per step
    cos = np.sum(vectors["short"] * vectors["onednn"], axis=1)
    assert cos.min() > (0.9999 if dtype == torch.bfloat16 else 0.999999), cos


def test_bf16_without_amx_is_a_quiet_false(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A CPU (or a cap) without AMX has no bf16 short-rows kernel, and no warning saying it failed."""
    from embedserve.kernels import isa

    monkeypatch.setattr(isa, "kernel_isa", lambda: "avx2")
    short_linear.available.cache_clear()
    try:
        with caplog.at_level("DEBUG", logger="embedserve.kernels.short_linear"):
            assert not short_linear.available(torch.bfloat16)
        assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.records
    finally:
        short_linear.available.cache_clear()
