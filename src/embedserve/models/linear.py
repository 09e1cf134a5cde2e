"""`Linear` whose float32 CPU matmul runs on oneDNN instead of MKL.

torch's `F.linear` sends float32 on the CPU to MKL's sgemm. On the AMD EPYC (Zen 4) boxes
this project runs on that reached about 190 GFLOP/s on the model's projection shapes, while
oneDNN's float32 matmul (the library torch already uses for bf16) ran the same shapes about
2x faster; vLLM's CPU backend calls oneDNN too. Same float32 arithmetic, different kernels:
the op is checked once against `F.linear` and any mismatch or missing op falls back to it.
bf16/fp16 and other devices keep `F.linear` (already oneDNN for bf16 on the CPU).
"""

from __future__ import annotations

from functools import cache

import torch
from torch import nn
from torch.nn import functional

_POINTWISE = getattr(torch.ops.mkldnn, "_linear_pointwise", None)


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    assert _POINTWISE is not None
    return _POINTWISE(x, weight, bias, "none", [], "")


@cache
def onednn_fp32_available() -> bool:
    """oneDNN's linear exists here and equals F.linear on a small seeded problem."""
    available = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    if _POINTWISE is None or not available:
        return False
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=gen) for s in ((7, 67), (13, 67), (13,)))
    try:
        got = _onednn_linear(x, w, b)
    except RuntimeError:
        return False
    return got.shape == (7, 13) and torch.allclose(got, functional.linear(x, w, b), rtol=1e-5, atol=1e-5)


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2 and onednn_fp32_available():
            return _onednn_linear(x, self.weight, self.bias)
        return functional.linear(x, self.weight, self.bias)
