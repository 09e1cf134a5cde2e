"""Benchmark inputs with exact token lengths in the model's own tokenizer.

Every target gets the same texts. A text of "n tokens" has exactly n ids after the model's
tokenizer *including* its post-processor (e.g. Qwen3-Embedding's appended <|endoftext|>), so the
engine, sentence-transformers and a served peer all see n tokens.

Three sources: `random` joins words that are single tokens in this vocabulary (so the count is
exact by construction and only the first word needs checking); `pydocs` (Python's bundled
documentation and standard library sources, on every machine) and `peps` (the PEP .rst files
under `<data dir>/peps`) cut windows out of real text and nudge the window end until the count
is exact.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from embedserve.bench.target import BenchInput
from embedserve.errors import InvalidInputError
from embedserve.lengths import BUCKET_NAMES, bucket_range
from embedserve.parity.datasets.base import find_data_dir
from embedserve.parity.datasets.pydocs import plain_text

MIX = "mix"
SOURCES = ("random", "pydocs", "peps")
_WORD = re.compile(r"^[a-z]{3,10}$")


@dataclass(frozen=True)
class Workload:
    """The requests of one length setting: a uniform length ("512") or the mix ("mix")."""

    key: str
    texts: list[BenchInput]  # texts, or text + image parts (the image mix, bench/images.py)
    tokens: list[int]  # each input's tokens, image tokens included


def parse_lengths(spec: str) -> list[int]:
    try:
        lengths = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise InvalidInputError(f"--lengths must be comma-separated integers, got {spec!r}") from None
    if not lengths or any(n < 1 for n in lengths):
        raise InvalidInputError(f"--lengths needs positive token counts, got {spec!r}")
    return lengths


def parse_mix(spec: str) -> list[tuple[str, float]]:
    """`0-1K:0.4,1K-4K:0.3` -> [(bucket, weight)], weights normalized to sum to 1."""
    out: list[tuple[str, float]] = []
    for part in spec.split(","):
        name, sep, weight = part.strip().partition(":")
        if not sep:
            raise InvalidInputError(f"--mix item {part!r} must look like BUCKET:WEIGHT, e.g. 0-1K:0.4")
        bucket_range(name)  # raises naming the known buckets
        try:
            w = float(weight)
        except ValueError:
            raise InvalidInputError(f"--mix weight {weight!r} of {name} is not a number") from None
        if not w > 0 or not math.isfinite(w):
            raise InvalidInputError(f"--mix weight of {name} must be positive, got {weight}")
        out.append((name, w))
    if len({n for n, _ in out}) != len(out):
        raise InvalidInputError(f"--mix names a bucket twice: {spec!r}")
    total = sum(w for _, w in out)
    return sorted(((n, w / total) for n, w in out), key=lambda nw: BUCKET_NAMES.index(nw[0]))


def draw_mix_lengths(
    mix: list[tuple[str, float]], n: int, rng: np.random.Generator, min_tokens: int, max_tokens: int
) -> list[int]:
    """Bucket by weight, then log-uniform inside (max(lo+1, min_tokens), min(hi, max_tokens))."""
    names = [b for b, _ in mix]
    picks = rng.choice(len(names), size=n, p=[w for _, w in mix])
    out = []
    for i in picks:
        lo, hi = bucket_range(names[i])
        lo, hi = max(lo + 1, min_tokens), min(hi, max_tokens)
        if lo > hi:
            raise InvalidInputError(
                f"--mix bucket {names[i]} has no lengths within [{min_tokens}, {max_tokens}] tokens"
            )
        out.append(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
    return out


class TextMaker:
    def __init__(
        self, tokenizer_file: str | Path, source: str = "random", data_dir: str | Path | None = None
    ) -> None:
        self._tok = HFTokenizer.from_file(str(tokenizer_file))
        self._tok.no_truncation()
        self._tok.no_padding()
        self.num_special = self._tok.num_special_tokens_to_add(is_pair=False)
        if source not in SOURCES:
            raise InvalidInputError(f"unknown text source {source!r}; choose one of {', '.join(SOURCES)}")
        if source == "random":
            self._words = self._single_token_words()
        else:
            self._corpus = _read_peps(data_dir) if source == "peps" else plain_text()
            self._ids, self._offsets = self._index_corpus()
        self.source = source

    def count(self, text: str) -> int:
        return len(self._tok.encode(text).ids)

    def make(self, n_tokens: int, rng: np.random.Generator) -> str:
        if n_tokens <= self.num_special:
            raise InvalidInputError(
                f"{n_tokens} tokens leaves no room for text: this tokenizer adds {self.num_special} itself"
            )
        text = self._random(n_tokens, rng) if self.source == "random" else self._window(n_tokens, rng)
        got = self.count(text)
        if got != n_tokens:
            raise InvalidInputError(f"could not build a text of exactly {n_tokens} tokens (got {got})")
        return text

    def workload(self, key: str, lengths: list[int], seed: int) -> Workload:
        rng = np.random.default_rng([seed, len(key), *key.encode()])
        return Workload(key, [self.make(n, rng) for n in lengths], list(lengths))

    # ---- random words ----------------------------------------------------------------------

    def _single_token_words(self) -> list[str]:
        """Words that are one token both alone and after a space: n words are n tokens."""
        vocab = sorted(self._tok.get_vocab().values())
        decoded = self._tok.decode_batch([[i] for i in vocab])
        candidates = sorted({d.strip() for d in decoded if _WORD.match(d.strip())})
        alone = self._tok.encode_batch(candidates, add_special_tokens=False)
        spaced = self._tok.encode_batch([f"a {w}" for w in candidates], add_special_tokens=False)
        base = len(self._tok.encode("a", add_special_tokens=False).ids)
        words = [
            w
            for w, a, s in zip(candidates, alone, spaced, strict=True)
            if len(a.ids) == 1 and len(s.ids) == base + 1
        ]
        if len(words) < 100:
            raise InvalidInputError("this tokenizer has too few single-token words for random text")
        return words

    def _random(self, n_tokens: int, rng: np.random.Generator) -> str:
        picks = rng.integers(0, len(self._words), size=n_tokens - self.num_special)
        return " ".join(self._words[i] for i in picks)

    # ---- real text -------------------------------------------------------------------------

    def _index_corpus(self) -> tuple[list[int], list[tuple[int, int]]]:
        enc = self._tok.encode(self._corpus, add_special_tokens=False)
        return enc.ids, enc.offsets

    def _window(self, n_tokens: int, rng: np.random.Generator) -> str:
        want = n_tokens - self.num_special
        if want >= len(self._ids):
            raise InvalidInputError(f"the text corpus has only {len(self._ids)} tokens; {want} needed")
        start = int(rng.integers(0, len(self._ids) - want))
        end = start + want
        text = ""
        for _ in range(20):  # a cut can merge or split tokens at the edges: move the end until exact
            text = self._corpus[self._offsets[start][0] : self._offsets[min(end, len(self._ids)) - 1][1]]
            diff = self.count(text) - n_tokens
            if diff == 0:
                break
            end -= diff
        return text


def _read_peps(data_dir: str | Path | None, max_chars: int = 1_000_000) -> str:
    peps = find_data_dir(data_dir) / "peps"
    files = sorted(peps.glob("*.rst")) if peps.is_dir() else []
    if not files:
        raise InvalidInputError(
            f"no PEPs found under {peps}: pass --data-dir (the folder holding peps/) or use --text pydocs"
        )
    parts, size = [], 0
    for f in files:
        parts.append(f.read_text(encoding="utf-8", errors="replace"))
        size += len(parts[-1])
        if size >= max_chars:
            break
    return "\n\n".join(parts)
