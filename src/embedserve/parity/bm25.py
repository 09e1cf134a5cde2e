"""A small Okapi BM25 (Lucene's idf), used to prove a synthetic dataset is solvable."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class BM25:
    def __init__(self, docs: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self._tf = [Counter(words(d)) for d in docs]
        self._len = [sum(tf.values()) for tf in self._tf]
        self._avg = sum(self._len) / max(len(docs), 1)
        df: Counter[str] = Counter()
        for tf in self._tf:
            df.update(tf.keys())
        n = len(docs)
        self._idf = {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}

    def scores(self, query: str) -> list[float]:
        terms = words(query)
        out = []
        for tf, dl in zip(self._tf, self._len, strict=True):
            norm = self.k1 * (1 - self.b + self.b * dl / self._avg)
            s = 0.0
            for t in terms:
                f = tf.get(t, 0)
                if f:
                    s += self._idf[t] * f * (self.k1 + 1) / (f + norm)
            out.append(s)
        return out


def accuracy_at_1(
    corpus: Mapping[str, str], queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]]
) -> float:
    """Share of judged queries whose best BM25 document is a relevant one."""
    doc_ids = list(corpus)
    index = BM25([corpus[d] for d in doc_ids])
    hits = 0
    for qid, judged in qrels.items():
        scores = index.scores(queries[qid])
        relevant = [s for d, s in zip(doc_ids, scores, strict=True) if judged.get(d, 0) > 0]
        others = [s for d, s in zip(doc_ids, scores, strict=True) if judged.get(d, 0) <= 0]
        # A tie with an irrelevant document counts as a miss: the answer must be unambiguous.
        hits += bool(relevant) and max(relevant) > max(others, default=float("-inf"))
    return hits / max(len(qrels), 1)
