"""What a parity dataset is: corpus + queries + graded relevance, and what loading one needs."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedserve.embedders.base import Item, Parts
from embedserve.parity.options import ParityError

DATA_DIR_ENV = "EMBEDSERVE_DATA_DIR"

# The inputs (texts, token ids, text + image Parts) are the vector sources' own (embedders/base.py).
__all__ = ["DATA_DIR_ENV", "Dataset", "DatasetContext", "Item", "Parts", "find_data_dir"]


@dataclass(frozen=True)
class Dataset:
    name: str
    corpus: dict[str, Item]  # doc id -> document (insertion order is the corpus order)
    queries: dict[str, Item]  # query id -> query text (embedded with the query prompt)
    # qid -> doc id -> graded gain; gain > 0 is relevant, 0 is judged non-relevant.
    qrels: dict[str, dict[str, int]]
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.corpus:
            raise ParityError(f"dataset {self.name}: no documents to embed")
        for qid, judged in self.qrels.items():
            if qid not in self.queries:
                raise ParityError(f"dataset {self.name}: qrels name unknown query {qid!r}")
            missing = [d for d in judged if d not in self.corpus]
            if missing:
                raise ParityError(f"dataset {self.name}: query {qid!r} judges unknown doc {missing[0]!r}")


@dataclass(frozen=True)
class DatasetContext:
    """What loaders may use: the data folder, the model's tokenizer and its limits."""

    data_dir: Path
    # Tokens the model sees for a text, its special tokens included.
    count_tokens: Callable[[str], int]
    # Ordinary (non-special) token ids the random-tokens dataset draws from.
    ordinary_ids: Sequence[int]
    max_length: int | None  # the smaller input limit of the two backends, when known
    progress: bool = False  # progress bars for downloads
    # Image tokens of a (width, height) image, when the model takes images (else None).
    image_tokens: Callable[[int, int], int] | None = None

    def require_data(self, sub: str) -> Path:
        path = self.data_dir / sub
        if not path.is_dir():
            raise ParityError(
                f"data folder {path} does not exist: pass --data-dir (or set {DATA_DIR_ENV}) "
                f"to the folder that holds {sub}/"
            )
        return path


def find_data_dir(explicit: str | Path | None = None) -> Path:
    """--data-dir, then $EMBEDSERVE_DATA_DIR, then ~/.cache/embedserve/datasets."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "embedserve" / "datasets"


def take_first(ids: Sequence[str], limit: int | None) -> list[str]:
    return list(ids) if limit is None else list(ids)[:limit]


def spread_sample(ids: Sequence[str], sizes: Sequence[int], limit: int | None) -> list[str]:
    """`limit` ids spread evenly over the size order (every length bucket keeps members)."""
    if limit is None or limit >= len(ids):
        return list(ids)
    if limit < 1:
        raise ParityError("a dataset limit must be >= 1")
    order = sorted(range(len(ids)), key=lambda i: (sizes[i], ids[i]))
    picks = sorted({order[round(j * (len(ids) - 1) / max(limit - 1, 1))] for j in range(limit)})
    return [ids[i] for i in picks]
