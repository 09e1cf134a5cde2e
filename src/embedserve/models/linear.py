"""`Linear` whose CPU matmuls run on oneDNN, with the weight packed once for it.

Two measured reasons, both on the AMD EPYC (Zen 4) boxes this project runs on:

- float32: torch's `F.linear` sends float32 on the CPU to MKL's sgemm, about 190 GFLOP/s on
  the model's projection shapes; oneDNN's float32 matmul (the library torch already uses for
  bf16, and vLLM's CPU backend calls) ran the same shapes about 2x faster.
- packing: given a plain [out, in] weight, oneDNN reorders it into its blocked layout inside
  every call. `prepack()` does that once and keeps the packed tensor as the only copy of the
  weight (an opaque `torch._mkldnn` tensor, the same bytes). The same matmul then ran 1.8-3.3x
  faster at 1-8 rows (short queries, the pooled rows of the last layer) and 3-7% faster at
  512-2,048 rows, in both dtypes (`benchmarks/packed_linear.py`).

Same arithmetic, different kernels: each dtype's path is checked once against `F.linear`
(plain and packed weight, 1 and 7 rows), and a mismatch or a missing op keeps `F.linear`.
Other dtypes and devices always keep `F.linear`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache

import torch
from torch import nn
from torch.nn import functional

_POINTWISE = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
_REORDER = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
_DTYPES = (torch.float32, torch.bfloat16)
# The row count oneDNN chooses the packed layout for. Layouts chosen for 64, 512 and 2,048
# rows ran every count from 1 to 2,048 within 2-5% of each other, so one hint serves all steps.
PACK_ROWS = 512


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    assert _POINTWISE is not None
    return _POINTWISE(x, weight, bias, "none", [], "")


def _pack(weight: torch.Tensor) -> torch.Tensor:
    assert _REORDER is not None
    return _REORDER(weight.detach(), PACK_ROWS)


@cache
def onednn_available(dtype: torch.dtype) -> bool:
    """oneDNN's linear, with a plain and a packed weight, equals F.linear on small seeded
    problems in this dtype (float32 or bfloat16)."""
    available = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    if dtype not in _DTYPES or _POINTWISE is None or _REORDER is None or not available:
        return False
    gen = torch.Generator().manual_seed(0)
    w, b = (torch.randn(*s, generator=gen).to(dtype) for s in ((13, 67), (13,)))
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    try:
        packed = _pack(w)
        for rows in (1, 7):
            x = torch.randn(rows, 67, generator=gen).to(dtype)
            want = functional.linear(x, w, b).float()
            for weight in (w, packed):
                got = _onednn_linear(x, weight, b)
                if got.shape != (rows, 13) or not torch.allclose(got.float(), want, rtol=tol, atol=tol):
                    return False
    except RuntimeError:
        return False
    return True


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.is_mkldnn:  # packed by `prepack`: only oneDNN reads it
            return _onednn_linear(x, self.weight, self.bias)
        if x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2 and onednn_available(x.dtype):
            return _onednn_linear(x, self.weight, self.bias)
        return functional.linear(x, self.weight, self.bias)

    def prepack(self) -> bool:
        """Replace a CPU float32 / bfloat16 weight by oneDNN's packed copy (the plain one is
        freed). False, and the weight untouched, where that does not apply. The module can
        no longer change dtype or device afterwards: pack last, once the model is final."""
        w = self.weight
        if w.is_mkldnn or w.device.type != "cpu" or w.dtype not in _DTYPES or not onednn_available(w.dtype):
            return False
        self.weight = nn.Parameter(_pack(w), requires_grad=False)
        return True


def prepack_enabled() -> bool:
    """Engines pack their CPU weights unless EMBEDSERVE_PREPACK=0 (for A/B runs)."""
    return os.environ.get("EMBEDSERVE_PREPACK", "1") != "0"


def prepack(model: nn.Module, after_each: Callable[[], object] | None = None) -> int:
    """Pack every `Linear` weight of a finished CPU model for oneDNN; returns how many.
    `after_each` runs after each weight is replaced: the engine returns the freed plain copy
    to the OS there (packing 0.6B bf16 weights peaked at +198 MB without, +24 MB with)."""
    packed = 0
    for m in model.modules():
        if isinstance(m, Linear) and m.prepack():
            packed += 1
            if after_each is not None:
                after_each()
    return packed
