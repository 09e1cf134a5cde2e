"""The CPU engine keeps freed heap pages for reuse and gives them back to the OS when a long
prompt ends or it goes idle (worker/host_memory.py)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch

from embedserve import Engine
from embedserve.config import PoolingMethod
from embedserve.engine import load, loop
from embedserve.engine.builder import build_engine
from embedserve.engine.core import EngineCore
from embedserve.request import EmbedParams, Request
from embedserve.worker import lane_runner, layer_major
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


# A lane unit's large buffers (fp32 at 2,048 rows: QKV, attention output, gate/up; two of
# them above glibc's largest mmap threshold, 32 MB) allocated, filled and freed unit after
# unit on a thread of its own, as the engine's: prints the page faults of 8 units (after 3).
_UNITS_SCRIPT = """
import resource, threading, torch
from embedserve.worker.host_memory import keep_freed_heap

kept = keep_freed_heap()
faults = []

def unit():
    qkv = torch.ones(2048, 4096)
    attn = torch.ones(2048, 2048)
    del qkv
    gate_up = torch.ones(2048, 6144)
    del attn, gate_up

def work():
    for _ in range(3):
        unit()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):
        unit()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

thread = threading.Thread(target=work)
thread.start()
thread.join()
print(kept, faults[0])
"""


def _python(script: str, **env: str) -> list[str]:
    """Runs `script` in a fresh interpreter (a known heap); its printed words."""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def _unit_faults(setting: str) -> tuple[str, int]:
    kept, faults = _python(_UNITS_SCRIPT, EMBEDSERVE_HEAP_REUSE=setting)
    return kept, int(faults)


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's (and no other allocator preloaded)")
def test_a_kept_heap_reuses_the_pages_units_freed() -> None:
    kept, reused = _unit_faults("1")
    default, faulted = _unit_faults("0")  # EMBEDSERVE_HEAP_REUSE=0: glibc's defaults
    assert (kept, default) == ("True", "False")
    assert faulted >= 8 * 24_000  # every buffer's pages fault in again, every unit (24,578 pages)
    assert reused < faulted / 2  # measured 61-74K vs 197K faults


def test_cpu_engines_keep_the_heap(qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def keep() -> bool:
        calls.append("kept")
        return True

    monkeypatch.setattr(load, "keep_freed_heap", keep)
    build_engine(qwen3_dir)
    assert calls == ["kept"]


def test_the_engine_loop_releases_free_heap_when_idle(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_trims(monkeypatch, loop)
    monkeypatch.setattr(loop, "IDLE_RELEASE_S", 0.5)
    with Engine.from_pretrained(qwen3_dir) as engine:
        time.sleep(1.5)
        idle = len(calls)
        for _ in range(5):  # back to back: never idle for 0.5 s
            engine.embed(["busy"])
        assert len(calls) == idle
        time.sleep(1.5)
        assert len(calls) == idle + 1  # once per idle period, not per timeout
    assert idle == 1


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
    assert int(_python(_SCRIPT)[-1]) > 100  # of the 200 MB freed


@pytest.mark.parametrize(("length", "per_layer"), [(512, True), (511, False)])
def test_a_long_lane_job_releases_free_heap_after_every_layer(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch, length: int, per_layer: bool
) -> None:
    """From TRIM_EVERY_LAYER_CHUNKS (4) chunks of 128 tokens; shorter jobs keep their pages
    for the next layer (the lane trims when the prompt ends)."""
    calls = _count_trims(monkeypatch, layer_major)
    core = _lane_core(qwen3_dir)
    assert core.lane is not None
    req = Request(0, random_ids(length, seed=1), EmbedParams(), PoolingMethod.LAST)
    job = layer_major.LayerMajorJob(core.lane.model, req, 128, torch.device("cpu"))
    while not job.done:
        job.run(128)
    assert len(calls) == (job.num_layers if per_layer else 0)


def test_the_lane_releases_free_heap_when_a_prompt_finishes(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_trims(monkeypatch, lane_runner)
    core = _lane_core(qwen3_dir)
    core.add(Request(0, random_ids(300, seed=2), EmbedParams(), PoolingMethod.LAST))
    finished = []
    while core.has_work:
        finished += core.step()
        assert len(calls) == len(finished)  # once per finished prompt, not per step
    assert len(finished) == 1 and finished[0].error is None
