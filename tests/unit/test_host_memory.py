"""Free heap pages go back to the OS (worker/host_memory.py), and the lane does it per layer."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from embedserve.config import PoolingMethod
from embedserve.engine import layer_major_lane
from embedserve.engine.builder import build_engine
from embedserve.engine.core import EngineCore
from embedserve.request import EmbedParams, Request
from embedserve.worker import layer_major
from tests.helpers.reference import random_ids

GLIBC = platform.libc_ver()[0] == "glibc" and "malloc" not in os.environ.get("LD_PRELOAD", "")

# In a fresh interpreter (a known heap): 100 KB tensors come from the heap (below glibc's
# mmap threshold); keeping the last one pins the heap's top, so only malloc_trim can give
# the pages of the freed ones back. Prints the MB returned.
_SCRIPT = """
import torch
from pathlib import Path
from embedserve.worker.host_memory import release_free_heap

def anon():
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024

blocks = [torch.ones(25_000) for _ in range(2_000)]
keep = blocks[-1]
del blocks
before = anon()
assert release_free_heap()
assert keep.sum().item() == 25_000
print((before - anon()) >> 20)
"""


def _count_trims(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> list[int]:
    """Replace `module.release_free_heap` with a counter; one entry per call."""
    calls: list[int] = []
    monkeypatch.setattr(module, "release_free_heap", lambda: calls.append(1) or True)
    return calls


def _lane_core(model_dir: Path) -> EngineCore:
    """Every prompt through the layer-major lane, chunks of 128 tokens."""
    return build_engine(model_dir, max_num_batched_tokens=128, layer_major_tokens=1).core


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's (and no other allocator preloaded)")
def test_freed_heap_pages_return_to_the_os() -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) > 100  # of the 200 MB freed


def test_a_lane_job_releases_free_heap_after_every_layer(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_trims(monkeypatch, layer_major)
    core = _lane_core(qwen3_dir)
    assert core.lane is not None
    req = Request(0, random_ids(300, seed=1), EmbedParams(), PoolingMethod.LAST)
    job = layer_major.LayerMajorJob(core.lane.model, req, 128, torch.device("cpu"))
    while not job.done:
        job.run(128)
    assert len(calls) == job.num_layers


def test_the_lane_releases_free_heap_when_a_prompt_finishes(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_trims(monkeypatch, layer_major_lane)
    core = _lane_core(qwen3_dir)
    core.add(Request(0, random_ids(300, seed=2), EmbedParams(), PoolingMethod.LAST))
    finished = []
    while core.has_work:
        finished += core.step()
        assert len(calls) == len(finished)  # once per finished prompt, not per step
    assert len(finished) == 1 and finished[0].error is None
