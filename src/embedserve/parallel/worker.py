"""A tensor-parallel worker process: rank r >= 1 of N.

    driver (rank 0)                              worker (rank r)
      spawn ------------------------------------>  load this rank's slices, pack them
      wait for every "loaded" <------------------  ("loaded", weight bytes) | ("error", text)
      join the group  <========================>  join the group
      per step: the SchedulerOutput ----------->  build the same step inputs, same forward
                (one message, pickled once)        (the collectives inside meet rank 0's)
      None (shut down) ------------------------>  exit 0

The worker keeps its own KV cache (its kv heads) and pooled rows nobody reads: every rank
ends a step with the whole hidden state (the last all-reduce), so rank 0 answers alone.
Any failure exits the process; its closed sockets fail rank 0's collective at once, and the
driver then reports the engine dead (parallel/runner.py). The driver's death closes the
pipe: the worker exits too, never waiting on a peer that is gone.
"""

from __future__ import annotations

import contextlib
import pickle
import signal
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from embedserve.config import ModelConfig
from embedserve.models.decoder import DecoderModel
from embedserve.models.packing import prepack
from embedserve.parallel.group import Group
from embedserve.parallel.model import build_rank_model, weight_bytes
from embedserve.parallel.sharding import plan_shard
from embedserve.scheduler.output import SchedulerOutput
from embedserve.settings import settings
from embedserve.worker.host_memory import packed_on_huge_pages
from embedserve.worker.model_runner import ModelRunner

LOADED, ERROR = "loaded", "error"


@dataclass(frozen=True)
class WorkerSpec:
    """All a rank needs to build its part (picklable: sent to the spawned process)."""

    rank: int
    world: int
    port: int
    config: ModelConfig
    weight_files: list[Path]
    num_blocks: int
    block_size: int
    dtype: torch.dtype
    device: torch.device
    threads: int


def rank_device(device: torch.device, rank: int) -> torch.device:
    """CUDA: one GPU per rank (rank r on GPU r); the CPU: the same CPU."""
    return torch.device("cuda", rank) if device.type == "cuda" else device


def build_rank(spec: WorkerSpec) -> tuple[DecoderModel, Group, int]:
    """This rank's group (not yet joined) and model; and its weight bytes."""
    device = rank_device(spec.device, spec.rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    group = Group(spec.rank, spec.world, device)
    shard = plan_shard(spec.config, spec.world, spec.rank)
    model = build_rank_model(spec.config, shard, spec.weight_files, group, device, spec.dtype)
    nbytes = weight_bytes(model)  # before packing: packed tensors report no storage
    if device.type == "cpu" and settings().prepack:
        prepack(model, short_rows=settings().short_rows)
        packed_on_huge_pages(model)
    return model, group, nbytes


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """The spawned process's entry point."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides when workers stop
    torch.set_num_threads(spec.threads)
    try:
        model, group, nbytes = build_rank(spec)
        device = rank_device(spec.device, spec.rank)
        runner = ModelRunner(model, spec.num_blocks, spec.block_size, spec.dtype, device)
        conn.send((LOADED, nbytes))
        group.connect(spec.port)
        with torch.inference_mode():
            while True:
                try:
                    payload = conn.recv_bytes()
                except EOFError:  # the driver is gone
                    return
                out: SchedulerOutput | None = pickle.loads(payload)
                if out is None:
                    return
                runner.execute(out)
    except BaseException:
        text = traceback.format_exc()
        print(f"embedserve tensor-parallel rank {spec.rank} failed:\n{text}", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):
            conn.send((ERROR, text.strip().splitlines()[-1]))
        sys.exit(1)
