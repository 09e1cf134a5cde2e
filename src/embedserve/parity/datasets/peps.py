"""PEPs as long-document known-item retrieval: query = the Abstract, document = the rest.

The RFC 822 header (PEP number, title, authors...) and the Abstract section are removed from
the document, so the query's words do not appear verbatim in it. PEPs without an Abstract
section, or with almost nothing besides it (fewer than 50 words, e.g. rejected stubs), are
skipped. Bodies run from a few hundred to over 30,000 tokens.
"""

from __future__ import annotations

from pathlib import Path

from embedserve.parity.datasets.base import Dataset, DatasetContext, Item, spread_sample
from embedserve.parity.options import Options

_UNDERLINE_CHARS = set("=-~^\"'`#*+:._")
MIN_BODY_WORDS = 50


def _is_underline(line: str, title: str) -> bool:
    s = line.rstrip()
    return len(s) >= max(len(title.strip()), 3) and len(set(s)) == 1 and s[0] in _UNDERLINE_CHARS


def _heading_at(lines: list[str], i: int) -> bool:
    """Is lines[i] a section title (reStructuredText: underlined with one punctuation char)?"""
    title = lines[i].strip()
    return bool(title) and i + 1 < len(lines) and _is_underline(lines[i + 1], title)


def split_pep(text: str) -> tuple[str, str] | None:
    """(abstract, rest-of-the-body), or None when either is missing or (nearly) empty."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))  # header ends
    body = lines[start:]
    head = next((i for i in range(len(body)) if body[i].strip() == "Abstract" and _heading_at(body, i)), None)
    if head is None:
        return None
    first = head + 2
    end = next((i for i in range(first, len(body)) if _heading_at(body, i)), len(body))
    # An overline above the next title belongs to that title.
    if end < len(body) and end > first and _is_underline(body[end - 1], body[end]):
        end -= 1
    top = head - 1 if head > 0 and _is_underline(body[head - 1], body[head]) else head
    abstract = "\n".join(body[first:end]).strip()
    rest = "\n".join(body[:top] + body[end:]).strip()
    if not abstract or len(rest.split()) < MIN_BODY_WORDS:
        return None
    return abstract, rest


def load_peps(ctx: DatasetContext, opts: Options) -> Dataset:
    root = ctx.require_data("peps")
    limit = opts.integer("docs")
    opts.finish()
    pairs: dict[str, tuple[str, str]] = {}
    files = sorted(Path(root).glob("pep-*.rst"))
    for f in files:
        split = split_pep(f.read_text(encoding="utf-8", errors="replace"))
        if split is not None:
            pairs[f.stem] = split
    ids = list(pairs)
    keep = spread_sample(ids, [len(pairs[i][1]) for i in ids], limit)
    corpus: dict[str, Item] = {i: pairs[i][1] for i in keep}
    queries: dict[str, Item] = {i: pairs[i][0] for i in keep}
    qrels = {i: {i: 1} for i in keep}
    info = {"source": str(root), "peps_read": len(files), "peps_usable": len(pairs)}
    return Dataset("peps", corpus, queries, qrels, info)
