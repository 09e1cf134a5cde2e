"""Cranfield: 1,400 aeronautics abstracts, 225 queries, graded relevance (1 best .. 4 least).

Quirks (see data/README.md): qrels name queries by *position* 1..225, not by the printed `.I`
number (001, 002, 004, ...); code -1 means not relevant and is dropped; gain = 5 - code.
Documents 471 and 995 are empty in the source: they keep their ids (so counts match the
collection and qrels stay valid) with a placeholder text, since an empty input is not embeddable.
"""

from __future__ import annotations

import re
from pathlib import Path

from embedserve.parity.datasets.base import Dataset, DatasetContext, Item, take_first
from embedserve.parity.options import Options, ParityError

EMPTY_DOC = "(empty document)"
_RECORD = re.compile(r"^\.I\s+(\S+)\s*$", re.M)
_FIELD = re.compile(r"^\.([A-Z])\s*$", re.M)


def _records(path: Path) -> list[tuple[str, dict[str, str]]]:
    """`.I id` records with `.X` fields; a repeated field is appended (two docs repeat `.W`)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    parts = _RECORD.split(text)
    out = []
    for rid, body in zip(parts[1::2], parts[2::2], strict=True):
        fields: dict[str, str] = {}
        pieces = _FIELD.split(body)
        for key, value in zip(pieces[1::2], pieces[2::2], strict=True):
            words = " ".join(value.split())
            fields[key] = f"{fields[key]} {words}".strip() if key in fields else words
        out.append((rid, fields))
    return out


def load_cranfield(ctx: DatasetContext, opts: Options) -> Dataset:
    root = ctx.require_data("cranfield")
    max_queries = opts.integer("queries")
    max_docs = opts.integer("docs")
    opts.finish()
    docs = _records(root / "cran.all.1400")
    corpus: dict[str, Item] = {rid: f.get("W") or f.get("T") or EMPTY_DOC for rid, f in docs}
    # Queries are numbered by position; the printed `.I` numbers have gaps.
    queries_all = {str(pos): f.get("W", "") for pos, (_, f) in enumerate(_records(root / "cran.qry"), 1)}
    qrels_all: dict[str, dict[str, int]] = {}
    for line_no, line in enumerate((root / "cranqrel").read_text().splitlines(), 1):
        cols = line.split()
        if not cols:
            continue
        if len(cols) != 3:
            raise ParityError(f"cranqrel line {line_no}: expected 3 columns, got {line!r}")
        qid, did, code = cols[0], cols[1], int(cols[2])
        if code < 1:  # -1: judged not relevant (dropped, as the collection's README says)
            continue
        judged = qrels_all.setdefault(qid, {})
        judged[did] = max(judged.get(did, 0), 5 - code)
    keep_q = take_first(list(queries_all), max_queries)
    queries: dict[str, Item] = {q: queries_all[q] for q in keep_q}
    qrels = {q: qrels_all[q] for q in keep_q if q in qrels_all}
    if max_docs is not None:
        judged_docs = {d for j in qrels.values() for d in j}
        keep = [d for d in corpus if d in judged_docs]
        keep += [d for d in corpus if d not in judged_docs][: max(max_docs - len(keep), 0)]
        kept = set(keep)
        corpus = {d: t for d, t in corpus.items() if d in kept}
    return Dataset(
        "cranfield",
        corpus,
        queries,
        qrels,
        {"source": str(root), "grading": "gain = 5 - code; code -1 dropped", "queries_by": "position"},
    )
