"""Packed weights moved onto 2 MB pages (worker/host_memory.py `on_huge_pages`, Linux 6.1+
MADV_COLLAPSE): whole pages move, the bytes stay, and an engine's vectors do not change."""

from __future__ import annotations

import logging
import platform
import re
from pathlib import Path

import pytest
import torch

from embedserve.config import PoolingMethod
from embedserve.engine.builder import build_engine
from embedserve.request import EmbedParams, Request
from embedserve.settings import settings
from embedserve.worker.host_memory import HUGE_PAGE, on_huge_pages
from tests.helpers.reference import random_ids
from tests.helpers.tiny_models import build_decoder

_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _collapse_supported() -> bool:
    """Linux 6.1 or later with transparent huge pages not set to never."""
    if platform.system() != "Linux" or not _THP.exists() or "[never]" in _THP.read_text():
        return False
    major, minor = (int(v) for v in re.findall(r"\d+", platform.release())[:2])
    return (major, minor) >= (6, 1)


SUPPORTED = _collapse_supported()
_needs_collapse = pytest.mark.skipif(not SUPPORTED, reason="needs Linux >= 6.1 with THP not 'never'")


def _huge_kb(address: int) -> int:
    """AnonHugePages of the mapping that holds `address` (/proc/self/smaps), in kB."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        span = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            inside = int(span.group(1), 16) <= address < int(span.group(2), 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def test_only_whole_pages_inside_the_range_are_asked_for() -> None:
    assert on_huge_pages(0, 8 * HUGE_PAGE) == 0  # no buffer
    buf = torch.ones(HUGE_PAGE // 4)  # 2 MB of floats: at most one whole page if aligned
    assert on_huge_pages(buf.data_ptr(), 0) == 0
    unaligned = buf.data_ptr() | 4096 if buf.data_ptr() % HUGE_PAGE == 0 else buf.data_ptr()
    assert on_huge_pages(unaligned, HUGE_PAGE - 4096) == 0  # holds no whole 2 MB page
    assert torch.equal(buf, torch.ones_like(buf))


@_needs_collapse
def test_whole_pages_move_and_their_bytes_stay() -> None:
    buf = torch.randn(9 * HUGE_PAGE // 4 + 1000)  # 18 MB and a bit: 8 or 9 whole pages inside
    before = buf.clone()
    moved = on_huge_pages(buf.data_ptr(), buf.numel() * 4)
    assert moved % HUGE_PAGE == 0 and 0 < moved <= buf.numel() * 4
    assert torch.equal(buf, before)
    assert _huge_kb(buf.data_ptr()) * 1024 >= moved


def _vectors(model_dir: Path, monkeypatch: pytest.MonkeyPatch, huge: str) -> torch.Tensor:
    monkeypatch.setenv("EMBEDSERVE_HUGE_PAGES", huge)
    settings.cache_clear()  # read once per process: this engine reads the switch just set
    core = build_engine(model_dir).core
    for i in range(3):  # short steps: the native short path reads the packed weights
        core.add(Request(i, random_ids(12 + 5 * i, seed=i, vocab=4000), EmbedParams(), PoolingMethod.LAST))
    finished = []
    while core.has_work:
        finished += core.step()
    assert len(finished) == 3 and all(f.vector is not None for f in finished)
    return torch.stack([f.vector for f in sorted(finished, key=lambda f: f.request.request_id)])


@_needs_collapse
def test_an_engine_moves_its_packed_weights_and_its_vectors_do_not_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # one layer whose gate, up and down weights (8 MB each in fp32) hold whole 2 MB pages
    model_dir = build_decoder(
        tmp_path / "m", hidden=256, layers=1, extra={"intermediate_size": 8192, "vocab_size": 4096}
    )
    with caplog.at_level(logging.INFO, logger="embedserve.worker.host_memory"):
        on = _vectors(model_dir, monkeypatch, "1")
        off = _vectors(model_dir, monkeypatch, "0")
    logged = [r.getMessage() for r in caplog.records if "2 MB pages" in r.getMessage()]
    assert len(logged) == 1, logged  # EMBEDSERVE_HUGE_PAGES=0: nothing moved, nothing logged
    moved, total = (float(v) for v in re.findall(r"([\d.]+) of ([\d.]+) MB", logged[0])[0])
    assert 0 < moved <= total
    assert torch.equal(on, off)
