"""Shared fixtures: tiny random-weight models built once per test session (offline)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from embedserve.settings import settings
from tests.helpers.tiny_models import build_decoder

if TYPE_CHECKING:
    from embedserve.index.store import Store

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# bfloat16 tests test the bfloat16 engine, also on a CPU without bf16 dot products (where a
# user's bfloat16 runs as float32: tests/unit/kernels/test_cpu_isa.py)
os.environ.setdefault("EMBEDSERVE_CPU_BF16", "1")
# likewise int8 tests test the int8 engine on a CPU without VNNI (where a user's int8 runs as
# float32: tests/unit/kernels/test_int8.py)
os.environ.setdefault("EMBEDSERVE_CPU_INT8", "1")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Build the native CPU kernels once, before any test (about 10 s on an empty cache), so
    no test that starts a server or times a step pays for the compiler."""
    import torch

    from embedserve.kernels import flash_attention, norm_rope

    flash_attention.available(torch.float32)
    flash_attention.available(torch.bfloat16)
    norm_rope.available()


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    """Settings are read once per process: forget them around each test so an env var a test
    sets with monkeypatch takes effect (and does not leak into the next test)."""
    settings.cache_clear()
    yield
    settings.cache_clear()


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def qwen3_dir(models_dir: Path) -> Path:
    """Qwen3-Embedding-style: EOS appended by the tokenizer, last-token pooling, normalize."""
    return build_decoder(models_dir / "qwen3", "qwen3")


@pytest.fixture(scope="session")
def qwen2_dir(models_dir: Path) -> Path:
    return build_decoder(models_dir / "qwen2", "qwen2", seed=1, pooling="mean")


@pytest.fixture(scope="session")
def llama_dir(models_dir: Path) -> Path:
    """Llama checkpoint saved as *ForCausalLM: weight names carry a `model.` prefix."""
    return build_decoder(models_dir / "llama", "llama", seed=2, pooling="cls", normalize=False)


@pytest.fixture(scope="session")
def mistral_dir(models_dir: Path) -> Path:
    """No sentence-transformers files: pooling defaults to last-token + normalize."""
    return build_decoder(models_dir / "mistral", "mistral", seed=3, st_files=False)


@pytest.fixture(scope="session")
def qwen3_vl_dir(models_dir: Path) -> Path:
    """Tiny Qwen3-VL saved as Qwen3VLModel (`language_model.*`, `visual.*`)."""
    from tests.helpers.tiny_vl import build_vl

    return build_vl(models_dir / "qwen3_vl")


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    """A Milvus Lite store of the test's own, closed after it (the index tests')."""
    from embedserve.index.store import Store

    s = Store(str(tmp_path / "store.db"))
    yield s
    s.close()
