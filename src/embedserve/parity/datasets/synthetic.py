"""LongEmbed-style synthetic long-context retrieval: one fact hidden per document.

`passkey`: "The pass key of NAME is 12345." inside repetitive filler; query "What is the pass
key of NAME?". `needle`: "The secret ingredient in NAME's famous dish is X." inside varied
seeded prose; query "What is the secret ingredient in NAME's famous dish?". Every fact names
a made-up person that occurs nowhere else and a query shares no other rare word with any
document, so BM25 finds it (checked at build time).

Documents are sized in the model's own tokens (`lengths`, default 256 .. 16K, `per_length`
facts each, needles at evenly spaced depths 0 .. 1), plus a probe just beyond the model's
limit when that limit is at most 16K (it exposes how each side truncates). Same seed and
tokenizer, same dataset.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

from embedserve.parity.bm25 import accuracy_at_1
from embedserve.parity.datasets.base import Dataset, DatasetContext, Item
from embedserve.parity.options import Options, ParityError

DEFAULT_LENGTHS = [256, 512, 1024, 2048, 4096, 8192, 16384]
PROBE_MAX_LIMIT = 16384  # beyond this a probe would cost more than it teaches
PROBE_EXTRA = 256

PASSKEY_INTRO = (
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it."
)
PASSKEY_FILLER = [
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
]
_ADJ = [
    "quiet", "broad", "early", "silver", "narrow", "gentle", "rough", "golden", "distant", "pale",
    "heavy", "bright", "hollow", "steady", "ancient",
]  # fmt: skip
_NOUN = [
    "river", "garden", "window", "harbor", "valley", "bridge", "lantern", "meadow", "tower", "market",
    "forest", "village", "orchard", "station", "library",
]  # fmt: skip
_VERB = [
    "faces", "follows", "crosses", "shelters", "overlooks", "borders", "hides", "reaches", "touches",
    "circles",
]  # fmt: skip
_INGREDIENT = [
    "saffron", "nutmeg", "tamarind", "cardamom", "fennel", "sumac", "juniper", "anise", "sorrel",
    "galangal", "lovage", "mace",
]  # fmt: skip
_SYLLABLES = [
    "zor", "vath", "quel", "lin", "bex", "dru", "mox", "tai", "vor", "ish", "kel", "phu", "yar", "gan",
    "sib", "rel", "tov", "nix", "wul", "jad",
]  # fmt: skip

Counter = Callable[[str], int]


def _names(rng: random.Random, n: int) -> list[str]:
    """n distinct three-syllable names (they never occur in any filler word list)."""
    taken: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(3)).capitalize()
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


def _prose(rng: random.Random) -> Iterator[str]:
    while True:
        a1, a2 = rng.choice(_ADJ), rng.choice(_ADJ)
        n1, n2, n3 = rng.choice(_NOUN), rng.choice(_NOUN), rng.choice(_NOUN)
        yield f"The {a1} {n1} {rng.choice(_VERB)} the {a2} {n2} near the {n3}."


def _repeat(sentences: list[str]) -> Iterator[str]:
    while True:
        yield from sentences


def _build_doc(
    count: Counter, target: int, depth: float, intro: str, fact: str, filler: Iterator[str]
) -> str:
    """Fill to about `target` tokens with the fact at `depth` (0 = first sentence, 1 = last).

    Pieces are counted with a leading space: byte-level BPE and WordPiece both split at
    spaces, so counts of space-joined sentences add up (the final length is re-measured).
    """
    overhead = count("")
    cache: dict[str, int] = {}

    def n(piece: str) -> int:
        if piece not in cache:
            cache[piece] = count(" " + piece) - overhead
        return cache[piece]

    fixed = overhead + (n(intro) if intro else 0) + n(fact)
    fill: list[str] = []
    total = fixed
    for sentence in filler:
        if total + n(sentence) > target:
            break
        fill.append(sentence)
        total += n(sentence)
    want = depth * (total - fixed)
    acc, k = 0, 0
    while k < len(fill) and acc + n(fill[k]) / 2 < want:
        acc += n(fill[k])
        k += 1
    head = [intro] if intro else []
    return " ".join([*head, *fill[:k], fact, *fill[k:]])


def _targets(lengths: list[int], probe: bool | None, max_length: int | None) -> list[int]:
    out = sorted(set(lengths))
    if max_length is None or any(t > max_length for t in out):
        return out
    if probe or (probe is None and max_length <= PROBE_MAX_LIMIT):
        out.append(max_length + PROBE_EXTRA)
    return out


def generate(
    kind: str,
    count: Counter,
    lengths: list[int],
    per_length: int,
    seed: int,
    max_length: int | None = None,
    probe: bool | None = None,
) -> Dataset:
    if kind not in ("passkey", "needle"):
        raise ParityError(f"unknown synthetic dataset {kind!r}")
    if per_length < 1:
        raise ParityError(f"{kind}: per_length must be >= 1")
    rng = random.Random(f"{kind}-{seed}")
    targets = _targets(lengths, probe, max_length)
    names = _names(rng, len(targets) * per_length)
    corpus: dict[str, Item] = {}
    queries: dict[str, Item] = {}
    docs_info = []
    for t_idx, target in enumerate(targets):
        for j in range(per_length):
            name = names[t_idx * per_length + j]
            depth = j / (per_length - 1) if per_length > 1 else 0.5
            if kind == "passkey":
                key = rng.randrange(10_000, 100_000)
                fact = f"The pass key of {name} is {key}. Remember it. {key} is the pass key of {name}."
                query = f"What is the pass key of {name}?"
                intro, filler = PASSKEY_INTRO, _repeat(PASSKEY_FILLER)
            else:
                fact = f"The secret ingredient in {name}'s famous dish is {rng.choice(_INGREDIENT)}."
                query = f"What is the secret ingredient in {name}'s famous dish?"
                intro, filler = "", _prose(rng)
            text = _build_doc(count, target, depth, intro, fact, filler)
            doc_id = f"{kind}-{target}-{j}"
            corpus[doc_id] = text
            queries[doc_id] = query
            probe_doc = max_length is not None and target > max_length
            docs_info.append(
                {
                    "id": doc_id,
                    "target_tokens": target,
                    "tokens": count(text),
                    "depth": round(depth, 4),
                    "probe": probe_doc,
                }
            )
    qrels = {q: {q: 1} for q in queries}
    plain = {k: str(v) for k, v in corpus.items()}
    bm25 = accuracy_at_1(plain, {k: str(v) for k, v in queries.items()}, qrels)
    if bm25 < 1.0:
        raise ParityError(f"{kind} generator self-check failed: BM25 Acc@1 = {bm25:.3f} (must be 1.0)")
    info = {
        "seed": seed,
        "per_length": per_length,
        "target_lengths": targets,
        "bm25_acc@1": bm25,
        "documents": docs_info,
    }
    return Dataset(kind, corpus, queries, qrels, info)


def load_synthetic(kind: str, ctx: DatasetContext, opts: Options) -> Dataset:
    lengths = opts.integers("lengths", DEFAULT_LENGTHS)
    per_length = opts.integer("per_length", 4)
    seed = opts.integer("seed", 0)
    probe = opts.flag("probe")
    opts.finish()
    assert per_length is not None and seed is not None
    return generate(kind, ctx.count_tokens, lengths, per_length, seed, ctx.max_length, probe)
