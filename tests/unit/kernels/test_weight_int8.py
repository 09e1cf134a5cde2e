"""Weight-only int8 (kernels/weight_int8.py, kernels/short_linear_w8.cpp, models/weight_int8.py):
the kernel gives the float32 short-rows kernel's bits on the dequantized weight; Q8_0 blocks
are recovered exactly from a weight that is Q8_0 (gguf's quantizer), never from one that is
not; quantizing rounds as Q8_0 does; bad shapes are refused by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.kernels import short_linear, weight_int8
from embedserve.kernels.weight_int8 import Blocks
from embedserve.models.linear import Linear, SiluGateUp
from embedserve.models.weight_int8 import q8_0, q8_0_exactly, quantize_weights
from tests.helpers.cpu import short_rows_dtypes
from tests.helpers.tiny_models import build_decoder

FLOAT32 = [p for p in short_rows_dtypes() if p.values[0] == torch.float32]
ROOT = Path(__file__).resolve().parents[3]


def _random(rows: int, k: int, group: int, seed: int) -> Blocks:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (rows, k), generator=gen, dtype=torch.int8)
    return Blocks.of(q, torch.rand(rows, k // group, generator=gen) * 0.01 + 1e-4)


def _f32_kernel(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The float32 short-rows kernel on a float weight [n, k] in its layout (n % 64 == 0)."""
    n, k = w.shape
    blocks = w.view(n // 64, 64, k).permute(0, 2, 1).contiguous()
    return short_linear.linear(x, short_linear.Packed(blocks.data_ptr(), torch.float32, n, k, blocks), bias)


@pytest.mark.parametrize("dtype", FLOAT32)
@pytest.mark.parametrize(("n", "k", "group"), [(256, 160, 32), (128, 96, 96), (64, 3072, 32)])
@pytest.mark.parametrize("rows", [1, 5, 16, 32])
def test_the_kernel_is_the_float32_kernel_on_the_dequantized_weight(
    dtype: torch.dtype, n: int, k: int, group: int, rows: int
) -> None:
    assert weight_int8.available() and short_linear.available(torch.float32)
    w = _random(n, k, group, seed=rows)
    x = torch.randn(rows, k + 3)[:, :k]  # strided rows
    bias = torch.randn(n)
    plain = w.dequantized()
    assert torch.equal(weight_int8.linear(x, w, bias), _f32_kernel(x, plain, bias))
    assert torch.equal(weight_int8.linear(x, w), _f32_kernel(x, plain, None))


@pytest.mark.parametrize("dtype", FLOAT32)
@pytest.mark.parametrize("rows", [1, 17, 64])
def test_padded_rows_and_the_gated_product_match_torch(dtype: torch.dtype, rows: int) -> None:
    w, u = _random(100, 64, 32, seed=1), _random(100, 64, 32, seed=2)
    assert w.q.shape == (2, 64, 64)  # 100 rows padded to 128 in the layout, cut from the result
    x, bias = torch.randn(rows, 64), torch.randn(100)
    wf, uf = w.dequantized(), u.dequantized()
    torch.testing.assert_close(weight_int8.linear(x, w, bias), x @ wf.T + bias, rtol=1e-5, atol=1e-5)
    gated = torch.nn.functional.silu(x @ wf.T) * (x @ uf.T)
    torch.testing.assert_close(weight_int8.silu_gate_up(x, w, u), gated, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", FLOAT32)
def test_rows_it_does_not_take_are_refused_by_name(dtype: torch.dtype) -> None:
    w = _random(64, 32, 32, seed=0)
    with pytest.raises(ValueError, match="1 to 64 float32 CPU rows of 32"):
        weight_int8.linear(torch.randn(3, 48), w)
    with pytest.raises(ValueError, match="1 to 64"):
        weight_int8.linear(torch.randn(65, 32), w)
    with pytest.raises(ValueError, match="float32"):
        weight_int8.linear(torch.randn(3, 32, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="one shape and scale group"):
        weight_int8.silu_gate_up(torch.randn(3, 32), w, _random(128, 32, 32, seed=1))
    with pytest.raises(ValueError, match="do not match"):
        Blocks.of(torch.zeros(64, 32, dtype=torch.int8), torch.ones(64, 3))


def test_q8_0_blocks_are_recovered_exactly_from_ggufs_quantizer() -> None:
    gguf = pytest.importorskip("gguf")
    kind = gguf.GGMLQuantizationType.Q8_0
    w = np.random.default_rng(0).standard_normal((96, 128)).astype(np.float32) * 0.05
    w[3, :32] = 0.0  # a block of zeros
    stored = gguf.quants.quantize(w, kind)
    loaded = torch.from_numpy(np.array(gguf.quants.dequantize(stored, kind), dtype=np.float32))
    blocks = q8_0_exactly(loaded)
    assert blocks is not None and blocks.group == 32
    assert torch.equal(blocks.dequantized(), loaded)  # the file's weight, bit for bit
    raw = np.frombuffer(stored.tobytes(), dtype=np.uint8).reshape(96, 4, 34)  # [d: f16][q: 32 x int8]
    want_q = torch.from_numpy(raw[:, :, 2:].copy().view(np.int8).reshape(96, 128))
    got_q = blocks.q.permute(0, 2, 1).reshape(-1, 128)[:96]
    assert torch.equal(got_q, want_q)  # the file's int8 values themselves


def test_a_weight_that_is_not_q8_0_is_not_taken_for_it() -> None:
    w = torch.randn(64, 64) * 0.1
    assert q8_0_exactly(w) is None
    near = q8_0(w).dequantized()
    assert q8_0_exactly(near) is not None  # quantized once: Q8_0 exactly
    near[5, 7] = torch.nextafter(near[5, 7], torch.tensor(1.0))  # one value one ulp away
    assert q8_0_exactly(near) is None
    assert q8_0_exactly(torch.randn(64, 48)) is None  # k not a multiple of 32


def test_quantizing_rounds_as_q8_0() -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(128, 96, generator=gen) * 0.02
    w[7] = 0.0
    blocks = q8_0(w)
    scales = blocks.scales.permute(0, 2, 1).reshape(128, 3)
    assert torch.equal(scales.half().float(), scales)  # float16 scales, as the format's
    err = (blocks.dequantized() - w).abs().reshape(128, 3, 32)
    assert bool(
        (err <= scales[..., None] * 0.5 * (1 + 1e-3)).all()
    )  # half a step, and the scale's float16 rounding
    assert torch.equal(blocks.dequantized()[7], torch.zeros(96))
    odd = q8_0(torch.randn(64, 40, generator=gen))  # k not a multiple of 32: one scale per row
    assert odd.group == 40


def test_a_projection_keeps_its_int8_form_and_frees_its_float_weight() -> None:
    gen = torch.Generator().manual_seed(4)
    plain, gated = Linear(96, 128), SiluGateUp(96, 64)
    for m in (plain, gated):
        m.weight.data = torch.randn(m.weight.shape, generator=gen) * 0.05
    x = torch.randn(100, 96, generator=gen)
    before = plain(x).detach()
    assert plain.to_weights8() == "quantized" and gated.to_weights8() == "quantized"
    assert plain.weight.stride() == (0, 0) and plain.weights8 is not None  # float weight freed
    assert gated.weights8 is not None and len(gated.weights8.parts) == 2  # gate and up apart
    w, g = plain.weights8.dequantized(), gated.weights8.dequantized()
    for rows in (3, 64, 100):  # the kernel, and more rows than it takes (widened per call)
        want = torch.nn.functional.linear(x[:rows], w, plain.bias)
        torch.testing.assert_close(plain(x[:rows]).detach(), want, rtol=1e-5, atol=1e-5)
        both = x[:rows] @ g.T
        want_gated = torch.nn.functional.silu(both[:, :64]) * both[:, 64:]
        torch.testing.assert_close(gated(x[:rows]).detach(), want_gated, rtol=1e-5, atol=1e-5)
    assert (plain(x).detach() - before).abs().max() < 0.02 * before.abs().max()  # near the float weight
    again = quantize_weights(w)
    assert again.form == "kept"  # an int8 weight's values are Q8_0 exactly: kept as they are


@pytest.mark.slow  # 37 s: two engines built in a fresh process
@pytest.mark.parametrize("dtype", FLOAT32)
def test_the_benchmark_checks_then_times_both_forms(dtype: torch.dtype, tmp_path: Path) -> None:
    model = build_decoder(tmp_path / "dec", hidden=128, layers=2, std=0.1)
    cmd = [sys.executable, "benchmarks/weight_int8.py", "--model", str(model), "--tokens", "1,16"]
    done = subprocess.run([*cmd, "--rounds", "1", "--queries", "2", "--threads", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "projections, 16 rows: float32" in done.stdout and "int8 / float32 per round" in done.stdout
    assert "query of 16 tokens: p50 float32" in done.stdout and "cosine 0.99" in done.stdout
