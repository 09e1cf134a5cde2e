"""The Cranfield collection (`<shared data>/cranfield`, CI only): 1,400 abstracts, 225 queries, graded qrels.

Records look like `.I 12` then fields `.T` (title) `.A` (authors) `.B` (source) `.W` (text).
Queries carry printed numbers (`.I 001, 002, 004, ...`) but `cranqrel` refers to them by
*position* (1..225). Relevance codes 1 (complete answer) .. 4 (background) become gains
5 - code; code -1 (not relevant) is dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.shared_data import SHARED_DATA

DATA_DIR = SHARED_DATA / "cranfield"


@dataclass(frozen=True)
class Cranfield:
    docs: list[str]  # index i holds document i + 1 (the `.I` numbers run 1..1400)
    queries: list[str]  # index i holds the query at position i + 1
    qrels: dict[int, dict[int, int]]  # query index -> {doc index: gain}


def _records(text: str) -> list[dict[str, str]]:
    out = []
    for chunk in re.split(r"^\.I [^\n]*\n", text, flags=re.M)[1:]:
        fields = dict(re.findall(r"^\.([TABW])\n(.*?)(?=^\.[TABW]\n|\Z)", chunk, flags=re.M | re.S))
        out.append({k: " ".join(v.split()) for k, v in fields.items()})
    return out


def load(root: Path = DATA_DIR) -> Cranfield:
    read = lambda name: (root / name).read_text(encoding="utf-8").replace("\r\n", "\n")  # noqa: E731
    docs = [r.get("W", "") for r in _records(read("cran.all.1400"))]
    queries = [r["W"] for r in _records(read("cran.qry"))]
    qrels: dict[int, dict[int, int]] = {}
    for line in read("cranqrel").splitlines():
        if not line.strip():
            continue
        q, d, code = (int(x) for x in line.split())
        if code != -1:
            qrels.setdefault(q - 1, {})[d - 1] = 5 - code
    return Cranfield(docs, queries, qrels)
