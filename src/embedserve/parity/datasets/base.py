"""What a parity dataset is: corpus + queries + graded relevance, and what loading one needs."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedserve.parity.options import ParityError

# A text, or raw token ids sent as they are (pure numerical parity, no prompt, no specials).
Item = str | tuple[int, ...]


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

    data_dir: Path | None
    # Tokens the model sees for a text, its special tokens included.
    count_tokens: Callable[[str], int]
    # Ordinary (non-special) token ids the random-tokens dataset draws from.
    ordinary_ids: Sequence[int]
    max_length: int | None  # the smaller input limit of the two backends, when known

    def require_data(self, sub: str) -> Path:
        if self.data_dir is None:
            raise ParityError(
                "no data folder found: pass --data-dir or set EMBEDSERVE_DATA_DIR "
                "(expected ../shared/data beside the project)"
            )
        path = self.data_dir / sub
        if not path.is_dir():
            raise ParityError(f"data folder {path} does not exist")
        return path


def find_data_dir(explicit: str | None) -> Path | None:
    """--data-dir, then $EMBEDSERVE_DATA_DIR, then ../shared/data beside the project root."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("EMBEDSERVE_DATA_DIR")
    if env:
        return Path(env)
    # src/embedserve/parity/datasets/base.py -> parents[4] is the project root (editable install).
    candidates = [Path(__file__).resolve().parents[4], Path.cwd()]
    for root in candidates:
        data = root.parent / "shared" / "data"
        if data.is_dir():
            return data
    return None


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
