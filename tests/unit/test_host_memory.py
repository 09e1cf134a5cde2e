"""Free heap pages go back to the OS (worker/host_memory.py), and the lane does it per layer."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch

from embedserve.config import PoolingMethod
from embedserve.engine.builder import build_engine
from embedserve.request import EmbedParams, Request
from embedserve.worker import host_memory, layer_major
from tests.helpers.reference import random_ids

GLIBC = platform.libc_ver()[0] == "glibc"


def _rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise OSError("no RssAnon")


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_freed_heap_pages_return_to_the_os() -> None:
    # 100 KB tensors come from the heap (below glibc's mmap threshold); keeping the last
    # one pins the heap's top, so only malloc_trim can give the freed pages back.
    blocks = [torch.ones(25_000) for _ in range(2_000)]  # 200 MB
    keep = blocks[-1]
    del blocks
    before = _rss_anon()
    assert host_memory.release_free_heap()
    assert before - _rss_anon() > 100 << 20
    assert keep.sum().item() == 25_000


def test_the_lane_releases_free_heap_after_every_layer(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(layer_major, "release_free_heap", lambda: calls.append(1) or True)
    core = build_engine(qwen3_dir, max_num_batched_tokens=128, layer_major_tokens=1).core
    assert core.lane is not None
    req = Request(0, random_ids(300, seed=1), EmbedParams(), PoolingMethod.LAST)
    job = layer_major.LayerMajorJob(core.lane.model, req, 128, torch.device("cpu"))
    while not job.done:
        job.run(128)
    assert len(calls) == job.num_layers
