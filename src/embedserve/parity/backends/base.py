"""The backend contract: embed items with a prompt, describe yourself for the report."""

from __future__ import annotations

import abc
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.parity.datasets import Item, Parts
from embedserve.parity.options import Options, ParityError
from embedserve.schema import fingerprint_model_dir


class Backend(abc.ABC):
    kind: str = ""
    spec: str = ""  # as given, secrets removed
    model_dir: Path | None = None  # local model files, when the backend has them
    max_length: int | None = None  # longest input in tokens, when known
    batch_items: int = 32  # how many items one embed() call gets at most
    batch_tokens: int = 16384  # ... and how many padded tokens

    def take_batching(self, opts: Options, items: int, tokens: int) -> None:
        self.batch_items = opts.integer("batch_size", items) or items
        self.batch_tokens = opts.integer("batch_tokens", tokens) or tokens

    @functools.cached_property
    def model_version(self) -> str:
        """The fingerprint `embedserve serve` reports for `model_dir`, computed once (it reads
        every byte). Backends without local files (http) report their server's instead."""
        assert self.model_dir is not None
        return fingerprint_model_dir(self.model_dir)

    def cache_identity(self) -> str | None:
        """What determines this backend's vectors, if they may be cached (references only)."""
        return None

    @abc.abstractmethod
    def embed(self, items: Sequence[Item], prompt: str) -> np.ndarray:
        """float32 [len(items), dim] in order; `prompt` is prepended to texts (never to token ids)."""

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """Everything that defines the vectors (model, version, dtype, profile, schema, config)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Free what the backend holds (models, threads, connections)."""


def split_items(items: Sequence[Item]) -> tuple[list[str], list[list[int]]]:
    """A batch is all texts or all token ids (one dataset side never mixes them). Image parts
    belong to multimodal backends, which take items whole."""
    if any(isinstance(i, Parts) for i in items):
        raise ParityError(
            "this backend's model takes text only; the dataset has image inputs (use a multimodal model)"
        )
    texts = [i for i in items if isinstance(i, str)]
    ids = [list(i) for i in items if isinstance(i, tuple)]
    if texts and ids:
        raise ValueError("a batch mixes texts and token ids")
    return texts, ids
