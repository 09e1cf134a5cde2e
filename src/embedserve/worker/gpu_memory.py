"""KV cache size from a GPU memory fraction (`gpu_memory_utilization`).

    total GPU memory x utilization
    |-- in use: weights (and whatever else this process holds) --|-- activation peak --|-- KV cache --|

The activation peak is measured, not guessed: one warm-up step at the worst shape the
scheduler can produce (a full token budget continuing the longest prompt, so attention reads
the most cached context) runs on a scratch cache, and the allocator's peak above the
starting point is what every step may need on top of weights and cache.
"""

from __future__ import annotations

from typing import Protocol

import torch

from embedserve.config import SchedulerConfig
from embedserve.errors import ModelLoadError
from embedserve.kv_cache.manager import blocks_for
from embedserve.models.build import EmbeddingModel
from embedserve.scheduler.output import ScheduledChunk, SchedulerOutput
from embedserve.worker.model_runner import ModelRunner, kv_bytes_per_block

_GIB = float(1 << 30)


def check_utilization(
    utilization: float, device: torch.device, kv_cache_memory: int | None, causal: bool
) -> None:
    """Refuse option combinations that cannot mean anything (before any weight is loaded)."""
    if not 0.0 < utilization <= 1.0:
        raise ModelLoadError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    if device.type != "cuda":
        raise ModelLoadError(f"gpu_memory_utilization sizes GPU memory; device is {device.type!r}")
    if kv_cache_memory is not None:
        raise ModelLoadError("pass either kv_cache_memory or gpu_memory_utilization, not both")
    if not causal:
        raise ModelLoadError("gpu_memory_utilization does not apply to encoder models: they keep no KV cache")


def kv_cache_blocks(
    *, total: int, free: int, weights: int, activation_peak: int, utilization: float, block_bytes: int
) -> int:
    """KV blocks that fit: the fraction's budget after weights and the activation peak, and
    never more than is free now (free is read after the weights were loaded)."""
    if min(total, free, weights, activation_peak) < 0 or block_bytes < 1:
        raise ValueError("memory sizes must be non-negative and a KV block at least one byte")
    budget = min(int(utilization * total) - weights - activation_peak, free - activation_peak)
    if budget < block_bytes:
        raise ModelLoadError(
            f"gpu_memory_utilization={utilization} leaves no room for a KV cache: "
            f"{utilization:.2f} x {total / _GIB:.2f} GiB total, {weights / _GIB:.2f} GiB in use "
            f"(weights), {activation_peak / _GIB:.2f} GiB activation peak, {free / _GIB:.2f} GiB free"
        )
    return budget // block_bytes


def worst_step(sched: SchedulerConfig, block_size: int) -> SchedulerOutput:
    """The last chunk of the longest prompt: a full token budget over the most cached context."""
    n = min(sched.max_num_batched_tokens, sched.max_model_len)
    start = sched.max_model_len - n
    table = list(range(blocks_for(sched.max_model_len, block_size)))
    return SchedulerOutput(step=0, chunks=[ScheduledChunk(0, start, [0] * n, table, (n - 1, n))])


class MemoryStats(Protocol):
    """The allocator facts the sizing needs (CUDA's; tests pass a fake)."""

    def synchronize(self) -> None: ...
    def empty_cache(self) -> None: ...
    def reset_peak(self) -> None: ...
    def allocated(self) -> int: ...
    def peak(self) -> int: ...
    def free_total(self) -> tuple[int, int]: ...


class CudaMemory:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def allocated(self) -> int:
        return int(torch.cuda.memory_allocated(self.device))

    def peak(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.device))

    def free_total(self) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(self.device)
        return int(free), int(total)


def measure_activation_peak(
    model: EmbeddingModel,
    sched: SchedulerConfig,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    memory: MemoryStats,
) -> int:
    """Bytes one worst-case step allocates above weights and KV cache (scratch cache excluded)."""
    scratch = ModelRunner(model, blocks_for(sched.max_model_len, block_size), block_size, dtype, device)
    memory.synchronize()
    memory.reset_peak()
    base = memory.allocated()
    scratch.execute(worst_step(sched, block_size))
    memory.synchronize()
    peak = memory.peak() - base
    del scratch
    memory.empty_cache()
    return max(peak, 0)


def gpu_kv_cache_memory(
    model: EmbeddingModel,
    sched: SchedulerConfig,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    utilization: float,
    memory: MemoryStats | None = None,
) -> int:
    """KV cache bytes (a whole number of blocks) for `utilization` of the GPU's memory."""
    mem = memory if memory is not None else CudaMemory(device)
    activation = measure_activation_peak(model, sched, block_size, dtype, device, mem)
    mem.empty_cache()
    free, total = mem.free_total()
    per_block = kv_bytes_per_block(model.config, block_size, dtype)
    blocks = kv_cache_blocks(
        total=total,
        free=free,
        weights=mem.allocated(),
        activation_peak=activation,
        utilization=utilization,
        block_bytes=per_block,
    )
    need = blocks_for(sched.max_model_len, block_size)
    if blocks < need:
        raise ModelLoadError(
            f"gpu_memory_utilization={utilization} gives {blocks} KV blocks, but one "
            f"{sched.max_model_len}-token prompt needs {need}: raise it or lower max_model_len"
        )
    return blocks * per_block
