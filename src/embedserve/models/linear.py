"""`Linear` whose CPU matmuls run on oneDNN, with the weight packed once for it.

Two reasons, both measured on the AMD EPYC (Zen 4) boxes this project runs on (the numbers:
docs/performance.md, 'float32 linears on oneDNN' and 'Weights packed once for oneDNN'):

- float32: torch's `F.linear` sends float32 on the CPU to MKL's sgemm, slow on AMD CPUs;
  oneDNN's float32 matmul (the library torch already uses for bf16, and vLLM's CPU backend
  calls) runs the model's projection shapes much faster.
- packing: given a plain [out, in] weight, oneDNN reorders it into its blocked layout inside
  every call. `prepack()` does that once and keeps the packed tensor as the only copy of the
  weight (an opaque `torch._mkldnn` tensor, the same bytes). The reorder is most of a call at
  a few rows (short queries, the pooled rows of the last layer) and little of one at
  thousands (`benchmarks/packed_linear.py`).

Same arithmetic, different kernels: each dtype's path is checked once against `F.linear`
(plain and packed weight, 1 and 7 rows), and a mismatch or a missing op keeps `F.linear`.
Other dtypes and devices always keep `F.linear`.

`SiluGateUp` is the gated MLP's input projection, silu(x G^T) * (x U^T) from one fused
[gate; up] weight. Packed, it runs as two oneDNN matmuls whose epilogues apply silu and the
product on the accumulators: no [T, 2 * intermediate] output, no separate elementwise passes,
and a contiguous result for the down projection.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch
from torch import nn
from torch.nn import functional

from embedserve.kernels import isa, short_linear
from embedserve.models.int8_linear import Int8Weight, quantize
from embedserve.models.row_padding import rows_padded
from embedserve.models.weight_int8 import WeightInt8, quantize_weights

_POINTWISE = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
_BINARY = getattr(_POINTWISE, "binary", None)  # (x W^T + b) <op> other, fused
_REORDER = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
_DTYPES = (torch.float32, torch.bfloat16)
# The row count oneDNN chooses the packed layout for. Layouts chosen for other counts ran no
# step size faster (docs/performance.md, 'Weights packed once'), so one hint serves all steps.
PACK_ROWS = 512


def _onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, keep_padding: bool = False
) -> torch.Tensor:
    """oneDNN's linear at a padded row count (`padded_rows`: rows are computed independently,
    so the real rows' bits are those of an exact call); `keep_padding`: the padding rows left on."""
    assert _POINTWISE is not None
    out = _POINTWISE(rows_padded(x), weight, bias, "none", [], "")
    return out if keep_padding else out[: x.shape[0]]


@cache
def bf16_matmuls() -> bool:
    """bf16 projections run as bf16 matmuls on oneDNN: it takes bf16 here and the CPU has bf16
    dot products (kernels/isa.py). Without them oneDNN emulates bf16 (2.7x slower than its
    fp32 on AVX-512 without BF16) or cannot pack it at all (AVX2): `_bf16_via_float32`."""
    return onednn_available(torch.bfloat16) and isa.bf16_dot_products()


def _bf16_via_float32(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, keep_padding: bool
) -> torch.Tensor:
    """bf16 rows and weight where the CPU has no bf16 matmul (`bf16_matmuls`: AVX2-only CPUs,
    AVX-512 without BF16; there only with EMBEDSERVE_CPU_BF16=1, kernels/isa.py):
    oneDNN's float32 matmul on their exact float32 values, rounded to bf16 once, as a bf16
    matmul with float32 sums does (in another order). ATen's bf16 fallback runs 5-6x slower
    (docs/performance.md, "AVX2-only CPUs"). One row runs as two (a zero row appended): oneDNN
    takes a single row on another kernel over a plain weight, whose sums differ in the last bit
    from the same row's in a larger call, and deterministic mode must not see that."""
    rows, b = x.shape[0], None if bias is None else bias.float()
    out = _onednn_linear(rows_padded(x.float(), minimum=2), weight.float(), b, keep_padding=True)
    return (out if keep_padding else out[:rows]).to(torch.bfloat16)


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


@cache
def onednn_gated_available(dtype: torch.dtype) -> bool:
    """oneDNN's silu and product epilogues on packed weights give silu(x G^T) * (x U^T)."""
    if _BINARY is None or not onednn_available(dtype):
        return False
    gen = torch.Generator().manual_seed(1)
    x, g, u = (torch.randn(*s, generator=gen).to(dtype) for s in ((7, 67), (13, 67), (13, 67)))
    want = (functional.silu(functional.linear(x, g).float()) * functional.linear(x, u).float()).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    try:
        got = _silu_gate_up(x, _pack(g), _pack(u))
    except RuntimeError:
        return False
    return got.shape == want.shape and torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)


def _silu_gate_up(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    assert _POINTWISE is not None and _BINARY is not None
    rows, x = x.shape[0], rows_padded(x)  # as `_onednn_linear`
    return _BINARY(x, _POINTWISE(x, gate, None, "swish", [], ""), up, None, "mul")[:rows]


def _short_reads(plain: torch.Tensor, *packed: torch.Tensor) -> list[short_linear.Packed] | None:
    """The packed weights as the short-rows kernel of their dtype reads them (its self-check
    passed here, each packing checked against its rows of `plain`), else None."""
    rows = [plain] if len(packed) == 1 else list(plain.chunk(len(packed)))
    reads = [short_linear.reads(r, p) for r, p in zip(rows, packed, strict=True)]
    return None if any(r is None for r in reads) else [r for r in reads if r is not None]


def _few_rows(x: torch.Tensor) -> bool:
    """x is rows the short-rows kernels take and there are few of them: a short query's step
    (the kernel then checks x against the weight: its dtype and width)."""
    return x.dim() == 2 and 0 < x.shape[0] <= short_linear.MAX_ROWS.get(x.dtype, 0) and x.stride(1) == 1


class Linear(nn.Linear):
    aten_when_compiled = False  # `for_codegen`: aten's linear while torch.compile traces
    # where the short-rows kernel reads the packed weight(s) (`prepack(short_rows=True)`); used
    # only while they are still the module's parameters
    short: list[short_linear.Packed] | None = None
    int8: Int8Weight | None = None  # `to_int8`: the int8 form that runs instead of the weight
    weights8: WeightInt8 | None = None  # `to_weights8`: int8 weights, float32 arithmetic
    observe: Callable[[torch.Tensor], None] | None = None  # calibration: sees every input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, keep_padding=False)

    def padded(self, x: torch.Tensor) -> torch.Tensor:
        """`forward(x)` with the padding rows of a oneDNN call left on (`padded_rows`; rows of
        no input), so that an elementwise op oneDNN runs after it (torch's CPU GELU) meets the
        same few row counts; the caller keeps rows [:len(x)] in the end."""
        return self._run(x, keep_padding=True)

    def _run(self, x: torch.Tensor, keep_padding: bool) -> torch.Tensor:
        if self.observe is not None:
            self.observe(x)
        if self.int8 is not None:
            return self._run_int8(x, keep_padding)
        if self.weights8 is not None:
            return self._run_weights8(x, keep_padding)
        if self.weight.is_mkldnn:  # packed by `prepack`: only oneDNN (or a short-rows kernel) reads it
            if self.short is not None and self.short[0].tensor is self.weight and _few_rows(x):
                return short_linear.linear(x, self.short[0], self.bias)
            return _onednn_linear(x, self.weight, self.bias, keep_padding)
        return self._plain(x, self.weight, keep_padding)

    def _plain(self, x: torch.Tensor, weight: torch.Tensor, keep_padding: bool) -> torch.Tensor:
        """x W^T + b over a plain (unpacked) weight: oneDNN for CPU float32 rows (and bf16 rows
        where the CPU has no bf16 matmul), aten's linear otherwise."""
        if self.aten_when_compiled and torch.compiler.is_compiling():
            return functional.linear(x, weight, self.bias)
        if x.device.type == "cpu" and x.dim() == 2 and onednn_available(torch.float32):
            if x.dtype == torch.float32:
                return _onednn_linear(x, weight, self.bias, keep_padding)
            if x.dtype == torch.bfloat16 and not bf16_matmuls():
                return _bf16_via_float32(x, weight, self.bias, keep_padding)
        return functional.linear(x, weight, self.bias)

    def _run_int8(self, x: torch.Tensor, keep_padding: bool) -> torch.Tensor:
        """The int8 matmul at a padded row count, like oneDNN's float one (`padded_rows`)."""
        assert self.int8 is not None
        if x.dim() != 2:
            return self.int8.run(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)
        out = self.int8.run(rows_padded(x))
        return out if keep_padding else out[: x.shape[0]]

    def _run_weights8(self, x: torch.Tensor, keep_padding: bool) -> torch.Tensor:
        """Few rows on the int8-weight kernel; more on oneDNN's float32 matmul over the weight
        widened for this call (a batch step's matmul outweighs the widening)."""
        assert self.weights8 is not None
        out = self.weights8.short(x, self.bias)
        return out if out is not None else self._plain(x, self.weights8.dequantized(), keep_padding)

    def to_weights8(self) -> str:
        """Keep the weight as int8 values and scales from now on (models/weight_int8.py); the
        float weight is freed (a zero-stride view of its shape stays, as `to_int8`'s). Returns
        the form taken: "kept" (it was exactly Q8_0) or "quantized"."""
        w = self.weight.detach()
        self.weights8 = quantize_weights(w, halves=2 if isinstance(self, SiluGateUp) else 1)
        self.weight = nn.Parameter(w.new_zeros(()).expand(w.shape), requires_grad=False)
        return self.weights8.form

    def to_int8(self, magnitude: torch.Tensor) -> None:
        """Run as int8 from now on (models/int8_linear.py); `magnitude`: each input channel's
        largest calibrated |x|. The float weight is freed; what stays is a zero-stride view of
        its shape, so code that reads the shape (layer_flops) still can."""
        w = self.weight.detach()
        self.int8 = quantize(w, self.bias, magnitude)
        self.weight = nn.Parameter(w.new_zeros(()).expand(w.shape), requires_grad=False)

    def packable(self) -> bool:
        """A plain CPU float32 / bfloat16 weight whose dtype passed oneDNN's self-check (bf16:
        on a CPU with bf16 dot products, `bf16_matmuls`)."""
        w = self.weight
        if (
            self.int8 is not None
            or self.weights8 is not None
            or w.is_mkldnn
            or w.device.type != "cpu"
            or w.dtype not in _DTYPES
        ):
            return False
        return bf16_matmuls() if w.dtype == torch.bfloat16 else onednn_available(w.dtype)

    def prepack(self, short_rows: bool = False) -> bool:
        """Replace a CPU float32 / bfloat16 weight by oneDNN's packed copy (the plain one is
        freed). False, and the weight untouched, where that does not apply. The module can
        no longer change dtype or device afterwards: pack last, once the model is final.
        `short_rows`: few rows go to the short-rows kernel where it reads this packing."""
        if not self.packable():
            return False
        plain = self.weight.detach()
        self.weight = nn.Parameter(_pack(plain), requires_grad=False)
        self.short = _short_reads(plain, self.weight) if short_rows else None
        return True


class SiluGateUp(Linear):
    """silu(x G^T) * (x U^T) from one weight whose rows are [G; U] (each `intermediate` rows,
    no bias): one matmul and the elementwise ops in place (a strided view of its output), or
    once packed, two fused oneDNN matmuls (a contiguous result; the [G; U] weight is freed)."""

    def __init__(self, in_features: int, intermediate: int) -> None:
        super().__init__(in_features, 2 * intermediate, bias=False)
        self.intermediate = intermediate
        self.gate: nn.Parameter | None
        self.up: nn.Parameter | None
        self.register_parameter("gate", None)  # the packed halves, once packed
        self.register_parameter("up", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None and self.up is not None:
            short = self.short
            if (
                short is not None
                and short[0].tensor is self.gate
                and short[1].tensor is self.up
                and _few_rows(x)
            ):
                return short_linear.silu_gate_up(x, short[0], short[1])
            return _silu_gate_up(x, self.gate, self.up)
        if self.weights8 is not None and (out := self.weights8.short_gated(x)) is not None:
            return out
        both, n = super().forward(x), self.intermediate  # in place: no [T, n] tensor per op
        return functional.silu(both[..., :n], inplace=True).mul_(both[..., n:])

    def prepack(self, short_rows: bool = False) -> bool:
        w = self.weight
        if self.gate is not None:  # packed as two halves already
            return False
        if not self.packable() or not onednn_gated_available(w.dtype):
            return super().prepack(short_rows)  # one packed matmul, or nothing
        n, plain = self.intermediate, w.detach()
        self.gate = nn.Parameter(_pack(plain[:n].contiguous()), requires_grad=False)
        self.up = nn.Parameter(_pack(plain[n:].contiguous()), requires_grad=False)
        self.short = _short_reads(plain, self.gate, self.up) if short_rows else None
        self.weight = nn.Parameter(torch.empty(0, dtype=w.dtype), requires_grad=False)
        return True
