"""The builder's entry to tensor parallelism: whether the model and machine can be split
(`check_parallel`), and starting the ranks (`start_parallel`)."""

from __future__ import annotations

import torch

from embedserve.errors import ModelLoadError
from embedserve.models.loader import ModelFiles
from embedserve.models.source import ModelSource
from embedserve.parallel.runner import TensorParallelRunner, threads_per_rank
from embedserve.parallel.sharding import plan_shard
from embedserve.parallel.worker import WorkerSpec


def check_parallel(size: object, files: ModelSource, device: torch.device) -> int:
    """The validated tensor_parallel_size; ModelLoadError naming what the model or the machine
    cannot split (options that do not combine with it are refused by engine/resolve.py)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ModelLoadError(f"tensor_parallel_size must be an integer >= 1, got {size!r}")
    if size == 1:
        return 1
    plan_shard(files.model, size, 0)  # heads / kv heads / MLP divisible, a decoder
    if not isinstance(files, ModelFiles):
        raise ModelLoadError(
            "tensor parallelism reads each rank's slices from a model directory's safetensors files; "
            f"{files.path} is not one"
        )
    if device.type == "cuda" and torch.cuda.device_count() < size:
        raise ModelLoadError(
            f"tensor_parallel_size {size} needs {size} GPUs (one per rank); "
            f"{torch.cuda.device_count()} visible"
        )
    return size


def start_parallel(
    files: ModelSource, size: int, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> TensorParallelRunner:
    """Spawn ranks 1..size-1, load rank 0 here; returns once all have joined."""
    assert isinstance(files, ModelFiles)  # check_parallel refused the others
    spec = WorkerSpec(
        rank=0,
        world=size,
        port=0,
        config=files.model,
        weight_files=files.weight_files,
        num_blocks=num_blocks,
        block_size=block_size,
        dtype=dtype,
        device=device,
        threads=threads_per_rank(size, device),
    )
    return TensorParallelRunner(spec)
