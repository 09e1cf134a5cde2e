"""gpu_memory_utilization: the sizing arithmetic, the warm-up step, option checks (CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from embedserve.cli import build_parser
from embedserve.config import SchedulerConfig
from embedserve.engine.builder import build_engine
from embedserve.engine.options import EngineOptions
from embedserve.errors import ModelLoadError
from embedserve.models.build import build_model
from embedserve.models.open import open_model
from embedserve.worker.gpu_memory import (
    check_utilization,
    gpu_kv_cache_memory,
    kv_cache_blocks,
    measure_activation_peak,
    worst_step,
)
from embedserve.worker.model_runner import kv_bytes_per_block

GIB = 1 << 30


def test_budget_is_the_fraction_minus_weights_and_activations() -> None:
    blocks = kv_cache_blocks(
        total=100 * GIB,
        free=80 * GIB,
        weights=16 * GIB,
        activation_peak=4 * GIB,
        utilization=0.9,
        block_bytes=GIB,
    )
    assert blocks == 90 - 16 - 4


def test_budget_never_exceeds_free_memory() -> None:
    # Another process holds 50 GiB: the fraction alone would promise more than exists.
    blocks = kv_cache_blocks(
        total=100 * GIB,
        free=34 * GIB,
        weights=16 * GIB,
        activation_peak=4 * GIB,
        utilization=0.9,
        block_bytes=GIB,
    )
    assert blocks == 34 - 4


def test_budget_rounds_down_to_whole_blocks() -> None:
    got = kv_cache_blocks(
        total=1000, free=1000, weights=100, activation_peak=50, utilization=0.5, block_bytes=30
    )
    assert got == (500 - 150) // 30


def test_no_room_is_a_clear_error() -> None:
    with pytest.raises(ModelLoadError, match=r"leaves no room.*16.00 GiB in use"):
        kv_cache_blocks(
            total=20 * GIB,
            free=4 * GIB,
            weights=16 * GIB,
            activation_peak=GIB,
            utilization=0.8,
            block_bytes=1,
        )
    with pytest.raises(ValueError, match="non-negative"):
        kv_cache_blocks(total=1, free=-1, weights=0, activation_peak=0, utilization=0.5, block_bytes=1)


def test_worst_step_is_a_full_budget_over_the_longest_context() -> None:
    out = worst_step(SchedulerConfig(max_num_batched_tokens=8192, max_model_len=16384), block_size=16)
    (chunk,) = out.chunks
    assert (chunk.start, chunk.num_tokens, len(chunk.block_table)) == (8192, 8192, 1024)
    assert chunk.pool_rows == (8191, 8192)
    short = worst_step(SchedulerConfig(max_num_batched_tokens=8192, max_model_len=1000), block_size=16)
    assert (short.chunks[0].start, short.chunks[0].num_tokens) == (0, 1000)


class FakeMemory:
    """CUDA allocator stand-in: the step 'allocates' `step_bytes` above what is resident."""

    def __init__(self, total: int, free: int, resident: int, step_bytes: int) -> None:
        self.total, self.free, self.resident, self.step_bytes = total, free, resident, step_bytes
        self.calls: list[str] = []

    def synchronize(self) -> None:
        self.calls.append("sync")

    def empty_cache(self) -> None:
        self.calls.append("empty")

    def reset_peak(self) -> None:
        self.calls.append("reset")

    def allocated(self) -> int:
        return self.resident

    def peak(self) -> int:
        return self.resident + self.step_bytes

    def free_total(self) -> tuple[int, int]:
        return self.free, self.total


def _model(path: Path) -> torch.nn.Module:
    return build_model(open_model(path), torch.device("cpu"), torch.float32)


def test_kv_memory_from_a_measured_step(qwen3_dir: Path) -> None:
    model = _model(qwen3_dir)
    sched = SchedulerConfig(max_num_batched_tokens=64, max_model_len=256)
    mem = FakeMemory(total=1 << 24, free=1 << 23, resident=1 << 20, step_bytes=1 << 21)
    assert measure_activation_peak(model, sched, 16, torch.float32, torch.device("cpu"), mem) == 1 << 21
    assert mem.calls == ["sync", "reset", "sync", "empty"]  # the real warm-up step ran in between
    got = gpu_kv_cache_memory(model, sched, 16, torch.float32, torch.device("cpu"), 0.5, memory=mem)
    per_block = kv_bytes_per_block(model.config, 16, torch.float32)
    assert got == ((1 << 23) - (1 << 20) - (1 << 21)) // per_block * per_block
    tight = FakeMemory(total=1 << 24, free=1 << 23, resident=(1 << 23) - 4 * per_block, step_bytes=0)
    with pytest.raises(ModelLoadError, match="one 256-token prompt needs 16"):
        gpu_kv_cache_memory(model, sched, 16, torch.float32, torch.device("cpu"), 0.5, memory=tight)


def test_option_checks() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    check_utilization(0.9, cuda, None, causal=True)
    for value in (0.0, 1.5, -0.1):
        with pytest.raises(ModelLoadError, match=r"must be in \(0, 1\]"):
            check_utilization(value, cuda, None, causal=True)
    with pytest.raises(ModelLoadError, match="device is 'cpu'"):
        check_utilization(0.9, cpu, None, causal=True)
    with pytest.raises(ModelLoadError, match="not both"):
        check_utilization(0.9, cuda, 1 << 30, causal=True)
    with pytest.raises(ModelLoadError, match="encoder"):
        check_utilization(0.9, cuda, None, causal=False)


def test_build_engine_refuses_before_loading(qwen3_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="device is 'cpu'"):
        build_engine(qwen3_dir, gpu_memory_utilization=0.9)


def test_cli_option_reaches_the_engine() -> None:
    args = build_parser().parse_args(["embed", "hi", "--device", "cuda", "--gpu-memory-utilization", "0.85"])
    assert EngineOptions.from_args(args).gpu_memory_utilization == 0.85
    assert EngineOptions.from_args(build_parser().parse_args(["embed", "hi"])).gpu_memory_utilization is None
