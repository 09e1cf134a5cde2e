"""A short step's decoder layers in one native call (short_forward.cpp): the Python path's own
norm, RoPE and short-rows projection kernels called back to back, with the causal attention of
each whole sequence over its own rows and the K/V cache store in between.

The caller (models/short_path.py) hands over each layer's weights as addresses: norms and
biases plain, projections oneDNN-packed and already confirmed readable by the short-rows
kernels (`short_linear.reads`), or all int8 weights (`weight_int8.Blocks`, float32 steps: the
loop then calls the int8-weight kernel's entry points, which take the float32 ones' arguments).
This module only checks what it is given and calls.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import torch

from embedserve.kernels import native, norm_rope, short_linear, weight_int8
from embedserve.kernels.weight_int8 import Blocks

_I64, _PTR, _F32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
# Rows up to which a step runs natively. bfloat16 goes past the short-rows kernels' own limit
# (short_linear.MAX_ROWS), where they still keep up with oneDNN at 128 rows and the loop saves
# what Python between the layer's operations costs; float32's kernel falls behind oneDNN past
# 32 rows (docs/performance.md, "Short rows on their own kernels", "Short steps in one native
# call").
ROWS_LIMIT = {torch.bfloat16: 128, torch.float32: 32}
_LAYER_FIELDS = ("in_norm", "qkv", "qkv_bias", "q_norm", "k_norm", "o", "post_norm", "gate", "up", "down")
_PROJECTIONS = ("qkv", "o", "gate", "up", "down")
Projection = short_linear.Packed | Blocks


class LayerStruct(ctypes.Structure):
    _fields_ = [(name, _PTR) for name in _LAYER_FIELDS]


class ModelStruct(ctypes.Structure):
    _fields_ = [
        *((name, _I64) for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate")),
        ("eps", _F32),
        ("scale", _F32),
        *((name, _PTR) for name in ("linear", "gate_up", "add_norm", "qk", "layer")),
    ]


@cache
def _kernel(dtype: torch.dtype) -> Callable[..., int] | None:
    """The dtype's entry point, where it and the kernels it calls built and passed their checks."""
    if dtype not in _SUFFIX or not (short_linear.available(dtype) and norm_rope.available(dtype)):
        return None
    lib = native.load("short_forward")
    if lib is None:
        return None
    fn = getattr(lib, f"embedserve_short_forward_{_SUFFIX[dtype]}")
    fn.restype = ctypes.c_int
    fn.argtypes = [_PTR, _PTR, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _PTR, _I64]
    return fn


def available(dtype: torch.dtype) -> bool:
    return _kernel(dtype) is not None


def _address(fn: Callable[..., int]) -> int:
    """Where a ctypes function's code starts (the native loop calls it through this)."""
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Shapes:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float


@dataclass(frozen=True)
class LayerWeights:
    """One layer's weights: norms and bias plain tensors of the dtype, projections `Packed` or
    int8 `Blocks`."""

    in_norm: torch.Tensor
    qkv: Projection
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: Projection
    post_norm: torch.Tensor
    gate: Projection
    up: Projection
    down: Projection


class ShortForward:
    """Layers of one decoder run natively on a step's rows. Holds the addresses of the weights
    it was given: the caller keeps those tensors alive and unchanged while this is used."""

    def __init__(self, dtype: torch.dtype, shapes: Shapes, layers: Sequence[LayerWeights]) -> None:
        kernel = _kernel(dtype)
        if kernel is None:
            raise ValueError(f"no native short forward for {dtype} here")
        s = shapes
        if s.heads % s.kv_heads or s.head_dim % 2:
            raise ValueError(f"short forward needs heads a multiple of kv_heads and an even head_dim: {s}")
        q_width = (s.heads + 2 * s.kv_heads) * s.head_dim
        projections = _projection_kernels(dtype, layers)
        structs = (LayerStruct * len(layers))()
        for struct, w in zip(structs, layers, strict=True):
            _check(w, dtype, s, q_width)
            for name in _LAYER_FIELDS:
                value = getattr(w, name)
                if isinstance(value, short_linear.Packed):
                    setattr(struct, name, value.address)
                elif isinstance(value, Blocks):
                    setattr(struct, name, ctypes.addressof(value.ref))
                elif value is not None:
                    setattr(struct, name, value.data_ptr())
        norms = norm_rope.entry_points(dtype)
        assert norms is not None  # `available` saw it
        (linear, gate_up), (add_norm, qk) = projections, norms
        self.dtype, self.shapes, self.rows_limit = dtype, s, ROWS_LIMIT[dtype]
        self._kernel, self._structs, self._layers = kernel, structs, tuple(layers)
        self._model = ModelStruct(
            len(layers), s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, s.eps, s.head_dim**-0.5,
            _address(linear), _address(gate_up), _address(add_norm), _address(qk),
            ctypes.cast(structs, ctypes.c_void_p),
        )  # fmt: skip

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    def run(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        seqs: Sequence[tuple[int, int]],
        slot_mapping: torch.Tensor | None = None,
        caches: Sequence[torch.Tensor] | None = None,
    ) -> None:
        """x [rows, hidden] (dense, the dtype) through every layer, in place. cos, sin [rows,
        head_dim]; seqs: (first row, rows) of each whole sequence, back to back from row 0;
        slot_mapping [rows] int64 (-1: not stored) with one [2, slots, kv_heads, head_dim]
        cache per layer, or neither."""
        rows, s = x.shape[0] if x.dim() == 2 else -1, self.shapes
        if not (0 < rows <= self.rows_limit and x.shape[1] == s.hidden and x.is_contiguous()):
            limit = self.rows_limit
            raise ValueError(
                f"short forward takes dense [rows <= {limit}, {s.hidden}] rows, got {tuple(x.shape)}"
            )
        tables = all(t.shape == (rows, s.head_dim) and t.is_contiguous() for t in (cos, sin))
        if not tables or any(t.dtype != self.dtype or t.device.type != "cpu" for t in (x, cos, sin)):
            raise ValueError(f"short forward takes {self.dtype} CPU rows and [rows, head_dim] rotary tables")
        flat = torch.tensor([v for seq in seqs for v in seq], dtype=torch.int64)
        slot_ptr, cache_ptrs, slots = None, None, 0
        if (slot_mapping is None) != (caches is None):
            raise ValueError("short forward takes a slot mapping and caches together, or neither")
        if slot_mapping is not None and caches is not None:
            slot_mapping, cache_ptrs, slots = self._cache_args(slot_mapping, caches, rows)
            slot_ptr = slot_mapping.data_ptr()
        rc = self._kernel(
            ctypes.byref(self._model), x.data_ptr(), rows, cos.data_ptr(), sin.data_ptr(), flat.data_ptr(),
            len(seqs), slot_ptr, cache_ptrs, slots,
        )  # fmt: skip
        if rc == 3:
            raise ValueError(f"short forward refused sequences {list(seqs)} over {rows} rows")
        if rc != 0:
            raise RuntimeError(f"native short forward failed (code {rc}) on {rows} rows")

    def _cache_args(
        self, slot_mapping: torch.Tensor, caches: Sequence[torch.Tensor], rows: int
    ) -> tuple[torch.Tensor, ctypes.Array[ctypes.c_void_p], int]:
        """The first `rows` slots (dense), the caches' addresses and their slot count."""
        s = self.shapes
        if len(caches) < self.num_layers or slot_mapping.dtype != torch.int64 or slot_mapping.numel() < rows:
            raise ValueError("short forward needs an int64 slot per row and a cache per layer")
        shape = caches[0].shape
        for c in caches[: self.num_layers]:
            good = c.dim() == 4 and c.shape[0] == 2 and tuple(c.shape[2:]) == (s.kv_heads, s.head_dim)
            if not (good and c.shape == shape and c.dtype == self.dtype and c.is_contiguous()):
                raise ValueError(f"short forward's caches are dense [2, slots, {s.kv_heads}, {s.head_dim}]")
        slot_mapping = slot_mapping[:rows].contiguous()
        if int(slot_mapping.max()) >= shape[1]:
            raise ValueError(f"a slot past the cache's {shape[1]}")
        ptrs = (ctypes.c_void_p * self.num_layers)(*(c.data_ptr() for c in caches[: self.num_layers]))
        return slot_mapping, ptrs, int(shape[1])


def _projection_kernels(
    dtype: torch.dtype, layers: Sequence[LayerWeights]
) -> tuple[Callable[..., int], Callable[..., int]]:
    """The (plain, gated) entry points every projection of `layers` is read by: all packed
    (the dtype's short-rows kernels), or all int8 weights (float32 steps)."""
    kinds = {type(getattr(w, name)) for w in layers for name in _PROJECTIONS}
    if kinds == {Blocks}:
        ref = weight_int8.ref_entry_points() if dtype == torch.float32 and weight_int8.available() else None
        if ref is None:
            raise ValueError("int8 weights in a short forward need the int8-weight kernel and float32 steps")
        return ref
    if kinds != {short_linear.Packed}:
        raise ValueError(f"short forward takes packed or int8 projections, one kind throughout: {kinds}")
    projections = short_linear.entry_points(dtype)
    assert projections is not None  # `available` saw it
    return projections


def _shape(p: Projection) -> tuple[torch.dtype, int, int]:
    """(dtype it computes in, rows, k); int8 weights with padded rows give -1 rows (the
    loop takes their padded outputs for the real ones)."""
    if isinstance(p, Blocks):
        return torch.float32, p.rows if p.rows % weight_int8.BLOCK == 0 else -1, p.k
    return p.dtype, p.n, p.k


def _check(w: LayerWeights, dtype: torch.dtype, s: Shapes, q_width: int) -> None:
    """Each tensor of the layer has the shape and dtype the native loop assumes."""
    attn = s.heads * s.head_dim
    packs = (
        (w.qkv, q_width, s.hidden), (w.o, s.hidden, attn), (w.gate, s.intermediate, s.hidden),
        (w.up, s.intermediate, s.hidden), (w.down, s.hidden, s.intermediate),
    )  # fmt: skip
    plain: list[tuple[torch.Tensor | None, int]] = [(w.in_norm, s.hidden), (w.post_norm, s.hidden)]
    plain += [(w.qkv_bias, q_width), (w.q_norm, s.head_dim), (w.k_norm, s.head_dim)]
    bad = [f"{_shape(p)[1]}x{p.k} {_shape(p)[0]}" for p, n, k in packs if _shape(p) != (dtype, n, k)]
    bad += [
        f"{tuple(t.shape)} {t.dtype}"
        for t, n in plain
        if t is not None and (t.shape != (n,) or t.dtype != dtype or not t.is_contiguous())
    ]
    if (w.q_norm is None) != (w.k_norm is None):
        bad.append("q_norm without k_norm")
    if bad:
        raise ValueError(f"short forward got weights it does not take: {', '.join(bad)}")
