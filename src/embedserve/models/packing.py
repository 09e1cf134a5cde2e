"""Model-wide steps over every `Linear` of a finished model (models/linear.py): weights packed
once for oneDNN, left plain for a compiler that generates its own matmuls, and the packed
buffers listed (for the huge pages they move onto)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from embedserve.kernels import short_linear
from embedserve.models.linear import Linear, SiluGateUp


def for_codegen(model: nn.Module) -> None:
    """Make a model's `Linear`s trace as aten's linear, for a compiler that generates its own
    matmul code (inductor): it cannot lower oneDNN's linear over a weight that is not a
    frozen constant. Leave the weights unpacked for it too (`prepack` not called)."""
    for m in model.modules():
        if isinstance(m, Linear):
            m.aten_when_compiled = True


def prepack(
    model: nn.Module, after_each: Callable[[], object] | None = None, *, short_rows: bool = False
) -> int:
    """Pack every `Linear` weight of a finished CPU model for oneDNN; returns how many.
    `after_each` runs after each weight is replaced: the engine returns the freed plain copy
    to the OS there, so the plain copies do not pile up in the heap while packing
    (docs/performance.md, 'Weights packed once for oneDNN'). `short_rows`: steps of few rows
    run on the short-rows kernels where they read the packing (off in deterministic mode:
    their sums may differ from oneDNN's in the last bit)."""
    packed = 0
    for m in model.modules():
        if isinstance(m, Linear) and m.prepack(short_rows):
            packed += 1
            if after_each is not None:
                after_each()
    return packed


def packed_buffers(model: nn.Module) -> list[tuple[int, int]]:
    """(address, bytes) of every oneDNN-packed weight of a model (`prepack`) and of every int8
    weight's values and scales (`Linear.to_weights8`), in module order."""
    buffers = []
    for m in model.modules():
        if isinstance(m, Linear):
            for w in (m.weight, m.gate, m.up) if isinstance(m, SiluGateUp) else (m.weight,):
                if w is not None and w.is_mkldnn:
                    buffers.append((short_linear.packed_address(w), int(torch.ops.mkldnn._nbytes(w))))
            for part in m.weights8.parts if m.weights8 is not None else ():
                buffers += [(t.data_ptr(), t.numel() * t.element_size()) for t in (part.q, part.scales)]
    return buffers
