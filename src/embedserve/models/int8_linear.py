"""W8A7 linears: int8 weights per output channel, activations quantized per token on the fly,
int32 sums on oneDNN's int8 matmul, and the few outlier input channels kept in float32.

How a row y = x W^T + b is computed (`Int8Weight.run`), every step exact but the two roundings:

- **Weights**, once at load: each output row n scaled to [-127, 127] (`w_scale[n]`), rounded.
- **Activations**, per call and per token t (no calibration file): the row's inliers mapped onto
  0..127 by an asymmetric scale s_t and zero point z_t, rounded. 7 bits, not 8: without VNNI,
  AVX2's int8 dot product (`vpmaddubsw`) adds two u8 x s8 products into a saturating int16,
  and 127 * 127 * 2 fits where 255 * 127 * 2 does not (measured: 8-bit inputs gave sums off by
  thousands on this path). One rule on every CPU keeps a model's int8 vectors the same everywhere.
- **Outliers**: the sixteenth of input channels of largest calibrated magnitude (`outlier_count`;
  LayerNorm outputs of BERT-like models hold a few channels 10-100x the rest, a decoder's MLP
  input many more) leave the int8 matmul and run as a [T, k] x [k, N] float32 product; without
  them every other channel of the token loses resolution. Measured, lowest probe cosine to
  float32: all-MiniLM-L6-v2 0.9991 with 8 channels, 0.9992 with K/16; SmolLM2-135M 0.9923 with
  8 (below the gate), 0.9983 with K/32, 0.9988 with K/16, 0.9992 with K/8.
- oneDNN returns sum_k q[t,k] Wq[n,k] * w_scale[n] (integer sums: exact, in any order, so a row's
  result does not depend on its batch); then y = s_t * (that - z_t * colsum[n] * w_scale[n])
  + x_out W_out^T + b, in float32.

The choices were measured, not guessed (docs/quantization.md): symmetric 8-bit activations,
7-bit weights and SmoothQuant-style migration each retrieved less of fp32's ranking on MiniLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from embedserve.kernels import int8_short, isa
from embedserve.kernels.int8_rows import LEVELS, finish_rows, quantize_rows
from embedserve.settings import settings

OUTLIER_SHARE = 16  # one input channel in this many stays float32 (LLM.int8()'s decomposition)


@dataclass
class Int8Weight:
    """One projection's int8 form (`quantize`), run by `Linear` in place of its float weight."""

    packed: torch.Tensor  # oneDNN's packed int8 weight [N, K] (outlier columns zero)
    w_scale: torch.Tensor  # [N] float32
    zero_fix: torch.Tensor  # [N] colsum(Wq) * w_scale: what a zero point of 1 adds to a row
    outliers: torch.Tensor  # [k] long: the input channels kept in float32
    mask: torch.Tensor  # [K] uint8: 1 at those channels
    w_out: torch.Tensor  # [k, N] float32: their weight columns, one row per channel
    bias: torch.Tensor  # [N] float32 (zeros where the projection has none)
    w_zero: torch.Tensor  # [N] long zeros: the weight's zero points, as oneDNN takes them
    short: bool = False  # few rows run on kernels/int8_short.cpp, which reads `packed` in place

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] float32 -> [T, N] float32. A step of few rows takes the short-rows kernel
        where it reads this weight: the same bytes as oneDNN's sums and `finish_rows`."""
        if x.shape[0] == 0:  # a step whose chunks pool no row (a decoder's last layer)
            return x.new_empty(0, self.w_scale.shape[0])
        rows = quantize_rows(x.contiguous(), self.mask, self.outliers)
        if self.short and x.shape[0] <= int8_short.MAX_ROWS:
            return int8_short.linear(rows, self.packed, self.w_scale, self.zero_fix, self.bias, self.w_out)
        sums = int8_short.onednn_sums(rows.q, self.packed, self.w_scale, self.w_zero)
        return finish_rows(sums, rows, self.zero_fix, self.bias, self.w_out)


def quantize(weight: torch.Tensor, bias: torch.Tensor | None, magnitude: torch.Tensor) -> Int8Weight:
    """The int8 form of a float weight [N, K]; `magnitude` [K]: each input channel's largest
    absolute value seen in calibration (its top `outlier_count` stay float32)."""
    w = weight.detach().float()
    n, k = w.shape
    outliers = magnitude.topk(outlier_count(k)).indices.sort().values
    w_out = w[:, outliers].t().contiguous()
    inner = w.index_fill(1, outliers, 0.0)
    w_scale = inner.abs().amax(dim=1).div_(127).clamp_(min=1e-30)
    wq = inner.div(w_scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    zero_fix = wq.sum(dim=1, dtype=torch.float64).mul_(w_scale.double()).float()
    b = torch.zeros(n) if bias is None else bias.detach().float().clone()
    packed = int8_short.prepack(wq)
    mask = torch.zeros(k, dtype=torch.uint8).index_fill_(0, outliers, 1)
    w_zero = torch.zeros(n, dtype=torch.long)
    short = settings().short_rows and int8_short.reads(wq, packed)
    return Int8Weight(packed, w_scale.contiguous(), zero_fix, outliers, mask, w_out, b, w_zero, short)


def outlier_count(k: int) -> int:
    """How many of a projection's `k` input channels stay float32: a sixteenth, at least 8."""
    return min(max(8, k // OUTLIER_SHARE), k - 1)


@cache
def int8_available() -> str | None:
    """None where oneDNN's int8 matmul runs here and gives exact integer sums on a check
    (127 x 127 products, the largest this path makes), else why not."""
    if not int8_short.ONEDNN_INT8:
        return "this PyTorch build has no oneDNN int8 linear (torch.ops.onednn.qlinear_pointwise)"
    gen = torch.Generator().manual_seed(0)
    w = torch.randint(-127, 128, (64, 96), generator=gen, dtype=torch.int8)
    w[0], x = 127, torch.randint(0, LEVELS + 1, (7, 96), generator=gen, dtype=torch.uint8)
    x[0] = LEVELS
    try:
        packed, zeros = int8_short.prepack(w), torch.zeros(64, dtype=torch.long)
        got = int8_short.onednn_sums(x, packed, torch.ones(64), zeros)
    except RuntimeError as e:
        return f"oneDNN's int8 linear failed its check: {e}"
    if not torch.equal(got.double(), x.double() @ w.double().t()):
        return "oneDNN's int8 linear gave inexact sums on its check"
    return None


def int8_isa() -> str:
    """The int8 dot product oneDNN uses here, for the start-up log."""
    flags = isa.cpu_flags()
    if "amx_int8" in flags:
        return "AMX-INT8"
    if "avx512_vnni" in flags or "avx_vnni" in flags:
        return "VNNI"
    return "AVX2 (no VNNI: vpmaddubsw, 7-bit activations keep its int16 sums exact)"
