"""Token-count buckets: a step's packed tokens padded up to one of a few fixed sizes.

CUDA graphs and `torch.compile(dynamic=False)` specialize on tensor shapes; with buckets a
server sees a bounded set of shapes (one per bucket) instead of one per distinct step size.
Padding rows sit after the last sequence and belong to none:

    rows       0 .. n-1 (real)            n .. bucket-1 (padding)
    input_ids  the step's tokens          0
    positions  the step's positions       0
    slots      where K/V go               -1   (never written: attention stores rows < n only)
    pooling    output_rows index real rows only, so padding never reaches a vector

Every attention route honours the padding (attention/cpu.py and attention/cuda.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import replace

import torch

from embedserve.worker.input_batch import StepInputs


def token_buckets(max_tokens: int, min_bucket: int = 16, linear_step: int = 1024) -> tuple[int, ...]:
    """Powers of two from `min_bucket` up to `linear_step`, then its multiples, ending at `max_tokens`.

    Doubling keeps small steps cheap to pad; past `linear_step` the waste stays under one step.
    """
    if max_tokens < 1 or min_bucket < 1 or linear_step < 1:
        raise ValueError(
            f"bucket sizes must be positive (max_tokens={max_tokens}, min_bucket={min_bucket}, "
            f"linear_step={linear_step})"
        )
    sizes: set[int] = {max_tokens}
    b = min_bucket
    while b < min(linear_step, max_tokens):
        sizes.add(b)
        b *= 2
    sizes.update(range(linear_step, max_tokens, linear_step))
    return tuple(sorted(s for s in sizes if s <= max_tokens))


def bucket_for(num_tokens: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `num_tokens` (buckets sorted ascending)."""
    if num_tokens < 1:
        raise ValueError(f"a step has at least one token, got {num_tokens}")
    i = bisect.bisect_left(buckets, num_tokens)
    if i == len(buckets):
        raise ValueError(f"{num_tokens} tokens exceed the largest bucket ({buckets[-1] if buckets else 0})")
    return buckets[i]


def pad_step_inputs(inputs: StepInputs, size: int) -> StepInputs:
    """Step inputs with every per-token tensor padded to `size` rows (see the module doc)."""
    n = inputs.input_ids.numel()
    if size < n:
        raise ValueError(f"cannot pad {n} tokens down to {size}")
    if size == n:
        return inputs
    extra = size - n

    def pad(t: torch.Tensor, value: int) -> torch.Tensor:
        return torch.cat([t, t.new_full((extra,), value)])

    meta = inputs.meta
    slot_mapping = None if meta.slot_mapping is None else pad(meta.slot_mapping, -1)
    return replace(
        inputs,
        input_ids=pad(inputs.input_ids, 0),
        positions=pad(inputs.positions, 0),
        token_type_ids=None if inputs.token_type_ids is None else pad(inputs.token_type_ids, 0),
        meta=replace(meta, slot_mapping=slot_mapping),
    )
