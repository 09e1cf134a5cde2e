"""`pydocs`: known-item retrieval built from Python's own documentation, on every machine.

Short and medium documents come from `pydoc_data.topics` (the help() topics bundled with
CPython, 60 usable of about 80, a hundred to several thousand tokens, the longest past 16K in
a WordPiece vocabulary): the query is a topic's first paragraph, the
document is the topic without that paragraph (its title kept), so the query's words do not
appear verbatim. Long documents (the 4K-8K and 8K-16K buckets) come from the standard
library's sources: the query is the first paragraph of a module's docstring, the document is
the module's source without that docstring. Topics whose remaining body has fewer than 50
words and modules without a docstring paragraph of at least 6 words are skipped.

Nothing is downloaded: same Python version and tokenizer, same dataset (the version is
recorded in the dataset's info).
"""

from __future__ import annotations

import ast
import re
import sys
import sysconfig
from pathlib import Path

from embedserve.parity.datasets.base import Dataset, DatasetContext, Item, spread_sample
from embedserve.parity.options import Options, ParityError

MIN_BODY_WORDS = 50
MIN_QUERY_WORDS = 6
DEFAULT_LONG = 12  # stdlib sources spread over (min_long, max_long] tokens
DEFAULT_MIN_LONG, DEFAULT_MAX_LONG = 4096, 16384
_TITLE_RULE = re.compile(r"^([*=\-~^]{3,})$")


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]


def split_topic(text: str) -> tuple[str, str] | None:
    """(first paragraph, the topic without it), or None for a title-only or very short topic."""
    paras = _paragraphs(text)
    head: list[str] = []
    if paras and len(paras[0].splitlines()) == 2 and _TITLE_RULE.match(paras[0].splitlines()[1].strip()):
        head, paras = [paras[0]], paras[1:]  # the underlined title stays with the document
    if len(paras) < 2:
        return None
    query, rest = paras[0], paras[1:]
    if len(query.split()) < MIN_QUERY_WORDS or len(" ".join(rest).split()) < MIN_BODY_WORDS:
        return None
    return " ".join(query.split()), "\n\n".join(head + rest)


def topic_pairs() -> dict[str, tuple[str, str]]:
    """`topic-NAME` -> (query, document) for every usable help() topic, in name order."""
    from pydoc_data.topics import topics

    out: dict[str, tuple[str, str]] = {}
    for name in sorted(topics):
        pair = split_topic(topics[name])
        if pair is not None:
            out[f"topic-{name}"] = pair
    return out


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_source(source: str) -> tuple[str, str] | None:
    """(first docstring paragraph, the source without its module docstring), or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    doc = ast.get_docstring(tree)
    if not doc or not tree.body:
        return None
    query = " ".join(_paragraphs(doc)[0].split())
    if len(query.split()) < MIN_QUERY_WORDS:
        return None
    node = tree.body[0]
    lines = source.splitlines()
    end = node.end_lineno or node.lineno
    rest = "\n".join(lines[: node.lineno - 1] + lines[end:]).strip()
    return (query, rest) if len(rest.split()) >= MIN_BODY_WORDS else None


def source_pairs(min_chars: int = 0, max_chars: int | None = None) -> dict[str, tuple[str, str]]:
    """`source-MODULE` -> (query, document) for public top-level stdlib modules, in name order."""
    out: dict[str, tuple[str, str]] = {}
    for path in sorted(stdlib_dir().glob("*.py")):
        if path.name.startswith("_"):
            continue
        size = path.stat().st_size
        if size < min_chars or (max_chars is not None and size > max_chars):
            continue
        pair = split_source(path.read_text(encoding="utf-8", errors="replace"))
        if pair is not None:
            out[f"source-{path.stem}"] = pair
    return out


def plain_text(max_chars: int = 1_000_000) -> str:
    """Real English and code to cut benchmark inputs from: the topics, then stdlib sources."""
    from pydoc_data.topics import topics

    parts = [topics[name] for name in sorted(topics)]
    size = sum(map(len, parts))
    for _, doc in source_pairs().values():
        if size >= max_chars:
            break
        parts.append(doc)
        size += len(doc)
    return "\n\n".join(parts)[:max_chars]


def _long_pairs(ctx: DatasetContext, count: int, lo: int, hi: int) -> dict[str, tuple[str, str]]:
    # Code runs 2.5-5 characters a token: a wide character window, then exact counts.
    candidates = source_pairs(min_chars=2 * lo, max_chars=6 * hi)
    sized = {k: ctx.count_tokens(v[1]) for k, v in candidates.items()}
    fit = [k for k in candidates if lo < sized[k] <= hi]
    keep = spread_sample(fit, [sized[k] for k in fit], count)
    return {k: candidates[k] for k in keep}


def load_pydocs(ctx: DatasetContext, opts: Options) -> Dataset:
    limit = opts.integer("docs")
    count = opts.integer("long", DEFAULT_LONG)
    lo = opts.integer("min_long", DEFAULT_MIN_LONG)
    hi = opts.integer("max_long", DEFAULT_MAX_LONG)
    opts.finish()
    assert count is not None and lo is not None and hi is not None
    if count < 0 or not 0 < lo < hi:
        raise ParityError("pydocs: need long >= 0 and 0 < min_long < max_long")
    topics = topic_pairs()
    ids = list(topics)
    keep = spread_sample(ids, [len(topics[i][1]) for i in ids], limit)
    pairs = {i: topics[i] for i in keep}
    if count:
        pairs.update(_long_pairs(ctx, count, lo, hi))
    corpus: dict[str, Item] = {i: doc for i, (_, doc) in pairs.items()}
    queries: dict[str, Item] = {i: query for i, (query, _) in pairs.items()}
    info = {
        "source": f"pydoc_data.topics and {stdlib_dir()}",
        "python": sys.version.split()[0],
        "topics": len(keep),
        "long_sources": len(pairs) - len(keep),
    }
    return Dataset("pydocs", corpus, queries, {i: {i: 1} for i in pairs}, info)
