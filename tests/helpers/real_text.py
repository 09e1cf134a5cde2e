"""Real text that every Python installation has: the help() topics and the stdlib's sources.

For tests that need real prose or code (tokenizer training, chunking, long inputs, indexing)
but measure nothing about retrieval. Deterministic for one Python version.
"""

from __future__ import annotations

from pydoc_data.topics import topics as _topics

from embedserve.parity.datasets.pydocs import topic_pairs

TOPIC_NAMES = sorted(_topics)


def topic(name: str) -> str:
    """One help() topic, e.g. topic("assert") or topic("typesseq") (one of the longest)."""
    return _topics[name]


def documents() -> list[str]:
    """Every help() topic, in name order (about 80 texts of 200 to 14,000 characters)."""
    return [_topics[n] for n in TOPIC_NAMES]


def long_text(min_chars: int) -> str:
    """The topics joined by blank lines until at least `min_chars` characters (all of them: ~460K)."""
    parts: list[str] = []
    size = 0
    for text in documents():
        parts.append(text)
        size += len(text)
        if size >= min_chars:
            break
    return "\n\n".join(parts)


def known_items() -> tuple[dict[str, str], dict[str, str]]:
    """(doc id -> document, query id -> query) with query id == its document's id."""
    pairs = topic_pairs()
    return {k: d for k, (_, d) in pairs.items()}, {k: q for k, (q, _) in pairs.items()}
