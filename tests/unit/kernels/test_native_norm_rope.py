"""The native RMSNorm (with its residual add) and q/k norm + RoPE kernels
(kernels/norm_rope.cpp): float32 equals the float64 formulas, bfloat16 the PyTorch ops in
bfloat16 (one rounding apart at most, rarely), and the decoder takes them for float32 and
bfloat16 CPU rows with the same outputs as its PyTorch ops."""

from __future__ import annotations

import pytest
import torch

from embedserve.config import ModelConfig
from embedserve.kernels import native, norm_rope
from embedserve.models import decoder_layer
from embedserve.models.decoder import DecoderModel
from embedserve.models.decoder_layer import Rotary

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C++ compiler for native kernels")


def _norm64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return weight.double() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope64(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x, cos, sin = x.double(), cos.double()[:, None], sin.double()[:, None]
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def test_kernels_build_and_pass_their_self_check_here() -> None:
    assert norm_rope.available(torch.float32)
    assert norm_rope.available(torch.bfloat16)
    assert not norm_rope.available(torch.float16)


def _bf16_ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """How many bfloat16 steps apart two bfloat16 tensors are, per element (their bit
    patterns as ordered integers; both finite)."""

    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = t.view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (ordered(got) - ordered(want)).abs()


def _torch_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The decoder's RMSNorm in PyTorch ops (float32 math, rounded before the weight)."""
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize(("rows", "n"), [(1, 7), (33, 1024), (5, 100)])
def test_bf16_add_rms_norm_equals_the_pytorch_ops(rows: int, n: int) -> None:
    """The residual add rounds exactly as PyTorch's; the normed rows are at most one bfloat16
    step off (float32 sums of squares in another order), and rarely."""
    gen = torch.Generator().manual_seed(rows + n)
    base = (3 * torch.randn(rows, n + 5, generator=gen)).bfloat16()
    x = base[:, :n]
    residual = torch.randn(rows, n, generator=gen).bfloat16()
    weight = (torch.rand(n, generator=gen) + 0.5).bfloat16()
    want_x = x + residual
    want = _torch_norm(want_x, weight, 1e-6)
    pad = base[:, n:].clone()
    got = norm_rope.add_rms_norm(x, residual, weight, 1e-6)
    assert got.dtype == torch.bfloat16
    assert torch.equal(x, want_x)
    ulps = _bf16_ulps(got, want)
    assert ulps.max() <= 1 and ulps.float().mean() < 0.02
    assert torch.equal(base[:, n:], pad)


@pytest.mark.parametrize("qk_norm", [True, False])
def test_bf16_qk_norm_rope_equals_the_pytorch_ops(qk_norm: bool) -> None:
    heads, kv_heads, d, rows = 16, 8, 128, 64
    gen = torch.Generator().manual_seed(7)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d, generator=gen).bfloat16()
    before = qkv.clone()
    weights = None
    if qk_norm:
        weights = (
            (torch.rand(d, generator=gen) + 0.5).bfloat16(),
            (torch.rand(d, generator=gen) + 0.5).bfloat16(),
        )
    cos, sin = Rotary(d, 1e6).cos_sin(torch.arange(3000, 3000 + rows), torch.bfloat16)
    norm_rope.qk_norm_rope(qkv, heads, kv_heads, weights, cos[:, 0], sin[:, 0], 1e-6)
    q0, k0, v0 = before.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    for got, x, w in ((q, q0, 0), (k, k0, 1)):
        x = x.reshape(rows, -1, d)
        want = Rotary.apply(_torch_norm(x, weights[w], 1e-6) if weights else x, cos, sin)
        ulps = _bf16_ulps(got.reshape(rows, -1, d), want)
        if qk_norm:  # a normed element one step off moves the rotated one by a step of its own
            assert ulps.float().mean() < 0.02
        else:
            assert ulps.max() == 0  # RoPE alone rounds exactly where PyTorch does
    assert torch.equal(v, v0)


@pytest.mark.parametrize(("rows", "n"), [(0, 16), (1, 7), (33, 1024), (5, 100)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_equals_float64(rows: int, n: int, with_residual: bool) -> None:
    gen = torch.Generator().manual_seed(rows * n)
    base = 3 * torch.randn(rows, n + 5, generator=gen)
    x = base[:, :n]  # rows n + 5 apart
    residual = torch.randn(rows, n, generator=gen) if with_residual else None
    weight = torch.rand(n, generator=gen) + 0.5
    want_x = x.double() + (residual.double() if residual is not None else 0)
    got = norm_rope.add_rms_norm(x, residual, weight, 1e-6)
    torch.testing.assert_close(x.double(), want_x, rtol=1e-6, atol=1e-6)  # updated in place
    torch.testing.assert_close(got.double(), _norm64(want_x, weight, 1e-6), rtol=1e-5, atol=1e-6)
    assert torch.equal(base[:, n:], base[:, n:])  # padding columns untouched


@pytest.mark.parametrize(("heads", "kv_heads", "d"), [(16, 8, 128), (4, 2, 10), (3, 3, 64)])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_qk_norm_rope_equals_float64_and_leaves_v(heads: int, kv_heads: int, d: int, qk_norm: bool) -> None:
    gen = torch.Generator().manual_seed(heads * d)
    rows = 50
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d, generator=gen)
    before = qkv.clone()
    weights = (torch.rand(d, generator=gen) + 0.5, torch.rand(d, generator=gen) + 0.5) if qk_norm else None
    positions = torch.arange(1000, 1000 + rows)
    cos, sin = Rotary(d, 1e6).cos_sin(positions, torch.float32)
    norm_rope.qk_norm_rope(qkv, heads, kv_heads, weights, cos[:, 0], sin[:, 0], 1e-6)
    q0, k0, v0 = before.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    for got, x, w in ((q, q0, 0), (k, k0, 1)):
        x = x.reshape(rows, -1, d)
        want = _rope64(_norm64(x, weights[w], 1e-6) if weights else x, cos[:, 0], sin[:, 0])
        torch.testing.assert_close(got.reshape(rows, -1, d).double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(v, v0)


def test_one_row_at_any_stride_and_overlapping_rows() -> None:
    """A single row may carry any row stride (a transposed column); overlapping rows (an
    expanded tensor) are refused, and RMSNorm keeps PyTorch's ops for them."""
    gen = torch.Generator().manual_seed(3)
    w = torch.rand(8, generator=gen) + 0.5
    one = torch.randn(8, 1, generator=gen).t()  # [1, 8], strides (1, 1)
    got = norm_rope.add_rms_norm(one, None, w, 1e-6).double()
    torch.testing.assert_close(got, _norm64(one, w, 1e-6), rtol=1e-5, atol=1e-6)  # float32 vs float64
    overlapping = torch.randn(1, 8, generator=gen).expand(3, 8)
    with pytest.raises(ValueError, match="stride 0 for n 8"):
        norm_rope.add_rms_norm(overlapping, None, w, 1e-6)
    norm = decoder_layer.RMSNorm(8, 1e-6)
    want = _norm64(overlapping, norm.weight, 1e-6)
    torch.testing.assert_close(norm(overlapping).double(), want, rtol=1e-5, atol=1e-6)


def test_bad_inputs_are_refused_by_name() -> None:
    w = torch.ones(8)
    with pytest.raises(ValueError, match=r"add_rms_norm takes float32 or bfloat16 CPU.*of one dtype"):
        norm_rope.add_rms_norm(torch.randn(4, 8).bfloat16(), None, w, 1e-6)
    with pytest.raises(ValueError, match=r"add_rms_norm takes float32 or bfloat16"):
        norm_rope.add_rms_norm(torch.randn(4, 8).half(), None, w.half(), 1e-6)
    with pytest.raises(ValueError, match="dense residual"):
        norm_rope.add_rms_norm(torch.randn(4, 8), torch.randn(8, 4).t(), w, 1e-6)
    cos = torch.ones(4, 8)
    with pytest.raises(
        ValueError, match=r"qk_norm_rope takes float32 or bfloat16 CPU qkv.*got qkv \(4, 31\)"
    ):
        norm_rope.qk_norm_rope(torch.randn(4, 31), 2, 1, None, cos, cos, 1e-6)
    with pytest.raises(ValueError, match="qk_norm_rope"):
        norm_rope.qk_norm_rope(torch.randn(4, 32), 2, 1, (w, torch.ones(4)), cos, cos, 1e-6)
    with pytest.raises(ValueError, match=r"of one dtype; got qkv \(4, 32\) torch.bfloat16"):  # float32 tables
        norm_rope.qk_norm_rope(torch.randn(4, 32).bfloat16(), 2, 1, None, cos, cos, 1e-6)


def _config(qk_norm: bool) -> ModelConfig:
    return ModelConfig(
        architecture="Qwen3ForCausalLM" if qk_norm else "Qwen2ForCausalLM",
        model_type="qwen3" if qk_norm else "qwen2",
        max_position_embeddings=128,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=96,
        vocab_size=100,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        qk_norm=qk_norm,
        qkv_bias=not qk_norm,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_decoder_layers_agree_with_and_without_the_kernels(
    monkeypatch: pytest.MonkeyPatch, qk_norm: bool, dtype: torch.dtype
) -> None:
    """Whole layers, through the lane's entry (run_layer), against the PyTorch ops in the
    same dtype; the kernels are called for every norm and every layer's q/k."""
    torch.manual_seed(0)
    model = DecoderModel(_config(qk_norm)).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.1 if p.dim() > 1 else 1.0)
    model = model.to(dtype)
    calls: list[str] = []

    def counted(name: str) -> None:
        real = getattr(norm_rope, name)

        def call(*args: object) -> object:
            calls.append(name)
            return real(*args)

        monkeypatch.setattr(norm_rope, name, call)

    counted("add_rms_norm")
    counted("qk_norm_rope")
    n = 40
    cfg = model.config

    def run() -> torch.Tensor:
        with torch.inference_mode():
            x = model.embed(torch.arange(n) % cfg.vocab_size)
            kv = x.new_zeros(2, cfg.num_key_value_heads, n, cfg.head_dim)
            for i in range(cfg.num_hidden_layers):
                x = model.run_layer(i, x, torch.arange(n), kv, 0)
            return model.norm(x).float()

    native_out = run()
    layers = cfg.num_hidden_layers
    assert calls.count("add_rms_norm") == 2 * layers + 1 and calls.count("qk_norm_rope") == layers
    monkeypatch.setattr(decoder_layer.norm_rope, "available", lambda dtype=torch.float32: False)
    calls.clear()
    torch_out = run()
    assert calls == []
    if dtype == torch.float32:
        torch.testing.assert_close(native_out, torch_out, rtol=1e-5, atol=1e-5)
    else:  # a few elements one bfloat16 step apart after the first norm, carried through
        cos = torch.nn.functional.cosine_similarity(native_out, torch_out, dim=-1)
        assert cos.min() > 0.9999
        assert (native_out - torch_out).abs().max() < 0.1
