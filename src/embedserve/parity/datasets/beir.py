"""A user dataset in BEIR layout: corpus.jsonl, queries.jsonl, qrels/<split>.tsv.

Documents are embedded as `title + " " + text` (BEIR's convention for dense models) and
qrels rows with a score <= 0 count as judged non-relevant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from embedserve.parity.datasets.base import Dataset, Item, take_first
from embedserve.parity.options import Options, ParityError


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise ParityError(f"BEIR dataset: {path} is missing")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ParityError(f"{path}:{n}: not JSON ({e})") from None
        if not isinstance(row, dict) or "_id" not in row:
            raise ParityError(f"{path}:{n}: each line must be an object with an _id")
        rows.append(row)
    return rows


def _qrels(path: Path) -> dict[str, dict[str, int]]:
    if not path.exists():
        raise ParityError(f"BEIR dataset: {path} is missing")
    out: dict[str, dict[str, int]] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        cols = line.split("\t")
        if n == 1 and cols[0] == "query-id":
            continue  # header
        if not line.strip():
            continue
        if len(cols) != 3:
            raise ParityError(f"{path}:{n}: expected query-id<TAB>corpus-id<TAB>score")
        try:
            score = int(cols[2])
        except ValueError:
            raise ParityError(f"{path}:{n}: score {cols[2]!r} is not an integer") from None
        out.setdefault(cols[0], {})[cols[1]] = max(score, 0)
    return out


def load_beir(folder: Path, opts: Options) -> Dataset:
    split = opts.text("split", "test") or "test"
    max_queries = opts.integer("queries")
    opts.finish()
    corpus: dict[str, Item] = {}
    for row in _jsonl(folder / "corpus.jsonl"):
        text = " ".join(s for s in (str(row.get("title") or ""), str(row.get("text") or "")) if s)
        if not text.strip():
            raise ParityError(f"BEIR dataset: document {row['_id']!r} has no title and no text")
        corpus[str(row["_id"])] = text
    all_queries = {str(r["_id"]): str(r.get("text") or "") for r in _jsonl(folder / "queries.jsonl")}
    qrels_all = _qrels(folder / "qrels" / f"{split}.tsv")
    unknown = [q for q in qrels_all if q not in all_queries]
    if unknown:
        raise ParityError(f"BEIR dataset: qrels name query {unknown[0]!r} missing from queries.jsonl")
    # Only judged queries are evaluated (as BEIR does); others are not embedded.
    keep = take_first([q for q in all_queries if q in qrels_all], max_queries)
    queries: dict[str, Item] = {q: all_queries[q] for q in keep}
    empty = [q for q in keep if not all_queries[q].strip()]
    if empty:
        raise ParityError(f"BEIR dataset: query {empty[0]!r} has no text")
    qrels = {q: qrels_all[q] for q in keep}
    return Dataset(folder.name, corpus, queries, qrels, {"source": str(folder), "split": split})
