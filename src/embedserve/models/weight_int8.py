"""Weight-only int8 projections (`quantization="int8-weights"`): each weight kept as int8 values
and float32 scales, a quarter of float32's bytes; activations, sums and everything else stay
float32. A short query reads every weight once, so fewer bytes is a faster query where the
weight stream bounds it (kernels/weight_int8.py); a batch step widens the weight to float32
per call and runs oneDNN's float32 matmul on it.

Two forms, the first that fits each weight:

- **Q8_0, exactly**: every group of 32 values along k is an int8 value times a float16 scale,
  bit for bit: a GGUF file's Q8_0 tensors, which the loader dequantized (llama.cpp's and gguf's
  quantizers give each block's largest value +-127, so the scale is that value over 127). Kept
  as those int8 values and scales, the weight is the file's, and the vectors are float32's on
  the dequantized file: bit for bit at short rows (the same FMAs in the same order).
- **Per output channel**: symmetric, -127..127, scale = the row's largest |w| / 127, rounded to
  nearest: the weight itself changes (engine/quantize.py gates the vectors it gives).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from embedserve.kernels import weight_int8
from embedserve.kernels.weight_int8 import Blocks
from embedserve.settings import settings

Q8_GROUP = 32  # GGUF Q8_0's block along k
LEVEL = 127


@dataclass(frozen=True)
class WeightInt8:
    """One projection's int8 weight: one part, or a gated MLP's (gate, up) halves."""

    parts: tuple[Blocks, ...]
    form: str  # "kept": the weight was exactly Q8_0 already (a GGUF's); "quantized": rounded to it

    def short(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
        """x W^T (+ bias) on the kernel where x is few rows it takes, else None."""
        if len(self.parts) != 1 or not _kernel_takes(x):
            return None
        return weight_int8.linear(x, self.parts[0], bias)

    def short_gated(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu(x G^T) * (x U^T) on the kernel where x is few rows it takes, else None."""
        if len(self.parts) != 2 or not _kernel_takes(x):
            return None
        return weight_int8.silu_gate_up(x, *self.parts)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight [N, K] (the parts' rows one after another)."""
        parts = [p.dequantized() for p in self.parts]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def _kernel_takes(x: torch.Tensor) -> bool:
    """x is few rows the kernel takes, and it runs here (EMBEDSERVE_SHORT_ROWS=0: every step
    widens the weight, as float32's short rows then stay on oneDNN)."""
    return weight_int8.takes(x) and settings().short_rows and weight_int8.available()


def quantize_weights(weight: torch.Tensor, halves: int = 1) -> WeightInt8:
    """The int8 form of a float weight [N, K] (`halves`: 2 for a gated MLP's [gate; up], each
    half its own part): kept where every part is exactly Q8_0, else quantized to it."""
    w = weight.detach().float()
    rows = w.chunk(halves) if halves > 1 else (w,)
    exact = [q8_0_exactly(r) for r in rows]
    if all(e is not None for e in exact):
        return WeightInt8(tuple(e for e in exact if e is not None), "kept")
    return WeightInt8(tuple(q8_0(r) for r in rows), "quantized")


def q8_0(w: torch.Tensor) -> Blocks:
    """Q8_0's rounding: per output row and 32 values along k (all of k where 32 does not divide
    it), scale = their largest |w| / 127 rounded to float16 (float32 where float16 cannot hold
    it), values rounded to nearest and clipped to +-127."""
    n, k = w.shape
    group = Q8_GROUP if k % Q8_GROUP == 0 else k
    blocks = w.reshape(n, k // group, group)
    exact = blocks.abs().amax(dim=2, keepdim=True).div_(LEVEL)
    half = exact.half().float()
    scale = torch.where((half > 0) & half.isfinite(), half, exact)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a block of zeros
    q = blocks.div(scale).round_().clamp_(-LEVEL, LEVEL).to(torch.int8)
    return Blocks.of(q.reshape(n, k), scale[..., 0])


def q8_0_exactly(w: torch.Tensor) -> Blocks | None:
    """`w` as Q8_0 blocks (32 values along k sharing a float16 scale) where it is exactly that,
    every value checked; else None."""
    n, k = w.shape
    if k % Q8_GROUP:
        return None
    blocks = w.reshape(n, k // Q8_GROUP, Q8_GROUP)
    scale = blocks.abs().amax(dim=2).div_(LEVEL)  # exact where the block's largest value is 127 x scale
    if not torch.equal(scale.half().float(), scale):
        return None
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    values = blocks / safe[..., None]
    q = values.round()
    if not torch.equal(q, values) or q.abs().amax() > LEVEL:
        return None
    q8 = q.to(torch.int8)
    if not torch.equal(q8.float().mul_(safe[..., None]), blocks):  # the kernel's product gives w again
        return None
    return Blocks.of(q8.reshape(n, k), safe)
