"""The AMX short-rows kernel: oneDNN's bits on oneDNN's packed weights, read in place, only where
the packing is the layout it reads, and off where vectors must not depend on the batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve import Engine
from embedserve.engine.builder import build_engine
from embedserve.kernels import amx_linear
from embedserve.models import linear
from embedserve.models.linear import Linear, SiluGateUp
from tests.helpers.reference import random_ids

pytestmark = pytest.mark.skipif(
    not amx_linear.available(), reason="no AMX (amx_bf16) on this CPU, or no C++ compiler for native kernels"
)
POINTWISE = torch.ops.mkldnn._linear_pointwise


def _packed(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    plain = (torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16)
    return plain, linear._pack(plain)


@pytest.mark.parametrize(("n", "k"), [(32, 32), (4096, 1024), (1024, 3072), (576, 576), (192, 576)])
def test_packings_of_model_shapes_are_the_blocks_the_kernel_reads(n: int, k: int) -> None:
    plain, packed = _packed(n, k, seed=n + k)
    assert amx_linear.packed_as_blocks(plain, packed)
    assert not amx_linear.packed_as_blocks(plain.flip(0).contiguous(), packed)  # other bytes: refused


def test_shapes_off_the_blocks_are_refused() -> None:
    plain, packed = _packed(48, 64, seed=1)  # 48 columns: not whole 32-column blocks
    assert not amx_linear.packed_as_blocks(plain, packed)
    x = torch.randn(3, 64).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="code 2"):
        amx_linear.linear(x, amx_linear.packed_address(packed), None, 48)


@pytest.mark.parametrize("rows", [1, 2, 15, 16, 17, 32, 40, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_plain_projection_gives_onednns_bits(rows: int, bias: bool) -> None:
    plain, packed = _packed(320, 1024, seed=rows)
    b = torch.randn(320).to(torch.bfloat16) if bias else None
    x = torch.randn(rows, 2048).to(torch.bfloat16)[:, 1024:]  # rows 2048 apart
    got = amx_linear.linear(x, amx_linear.packed_address(packed), b, 320)
    onednn = POINTWISE(x, packed, b, "none", [], "")
    if rows <= 32:  # a query's rows: the same sums in the same order
        assert torch.equal(got, onednn)
    else:  # oneDNN blocks more rows otherwise: an element may round the other way
        assert (got != onednn).float().mean().item() < 1e-3
    want = torch.nn.functional.linear(x.float(), plain.float(), None if b is None else b.float())
    torch.testing.assert_close(got.float(), want, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("rows", [1, 16, 33])
def test_gated_product_matches_onednns_fused_epilogues(rows: int) -> None:
    _, gate = _packed(3072, 1024, seed=10)
    _, up = _packed(3072, 1024, seed=11)
    x = torch.randn(rows, 1024).to(torch.bfloat16)
    got = amx_linear.silu_gate_up(x, amx_linear.packed_address(gate), amx_linear.packed_address(up), 3072)
    want = POINTWISE.binary(x, POINTWISE(x, gate, None, "swish", [], ""), up, None, "mul")
    differ = (got != want).float().mean().item()
    assert differ < 1e-3, differ  # the exp of silu may round the other way, rarely
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-3)


def test_bad_rows_are_refused_with_a_message() -> None:
    _, packed = _packed(64, 64, seed=2)
    with pytest.raises(ValueError, match="bfloat16 CPU rows"):
        amx_linear.linear(torch.randn(2, 64), amx_linear.packed_address(packed), None, 64)


def test_modules_take_the_kernel_for_few_rows_and_onednn_beyond(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = amx_linear.linear

    def counted(x: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append(x.shape[0])
        return real(x, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(amx_linear, "linear", counted)
    torch.manual_seed(0)
    layer = Linear(256, 320, bias=True).to(torch.bfloat16)
    plain = layer.weight.detach().clone()
    assert layer.prepack(short_rows=True) and layer.amx is not None
    for rows in (1, amx_linear.MAX_ROWS, amx_linear.MAX_ROWS + 1):
        x = torch.randn(rows, 256).to(torch.bfloat16)
        want = POINTWISE(x, linear._pack(plain), layer.bias, "none", [], "")
        assert torch.equal(layer(x), want)
    assert calls == [1, amx_linear.MAX_ROWS]
    other = Linear(256, 320).to(torch.bfloat16)
    assert other.prepack() and other.amx is None  # off unless asked
    mlp = SiluGateUp(256, 320).to(torch.bfloat16)
    assert mlp.prepack(short_rows=True) and mlp.amx is not None and len(mlp.amx) == 2
    x = torch.randn(5, 256).to(torch.bfloat16)
    assert mlp.gate is not None and mlp.up is not None
    torch.testing.assert_close(mlp(x), linear._silu_gate_up(x, mlp.gate, mlp.up), rtol=1e-2, atol=1e-3)


def test_float32_weights_stay_on_onednn() -> None:
    layer = Linear(256, 320)
    assert layer.prepack(short_rows=True) and layer.amx is None


def test_short_queries_through_the_engine_agree_with_onednn_and_deterministic_mode_keeps_it_off(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seqs = [random_ids(n, seed=n) for n in (1, 5, 9)]
    vectors = {}
    for mode in ("amx", "onednn", "det"):
        if mode == "onednn":
            monkeypatch.setattr(linear, "_amx_reads", lambda *_: None)
        parts = build_engine(
            qwen3_dir, dtype="bfloat16", max_num_batched_tokens=256, kv_cache_memory=1 << 22,
            deterministic=mode == "det",
        )  # fmt: skip
        reads = [m.amx for m in parts.core.runner.model.modules() if isinstance(m, Linear)]
        assert all(r is not None for r in reads) == (mode == "amx"), mode
        with Engine(parts) as engine:
            vectors[mode] = np.stack([engine.embed([s])[0] for s in seqs])  # one short query per step
    cos = np.sum(vectors["amx"] * vectors["onednn"], axis=1)
    assert cos.min() > 0.9999, cos
