"""Random token sequences of given lengths: pure numerical parity (no text, no prompt, no queries).

Ids are drawn from the tokenizer's ordinary tokens (special tokens excluded) and sent as they
are. Lengths above the model's limit are dropped: truncation is the synthetic probes' job.
"""

from __future__ import annotations

import numpy as np

from embedserve.parity.datasets.base import Dataset, DatasetContext, Item
from embedserve.parity.options import Options, ParityError

DEFAULT_LENGTHS = [16, 128, 512, 1024, 2048, 4096, 8192, 16384]


def load_random_tokens(ctx: DatasetContext, opts: Options) -> Dataset:
    lengths = opts.integers("lengths", DEFAULT_LENGTHS)
    per_length = opts.integer("per_length", 2)
    seed = opts.integer("seed", 0)
    opts.finish()
    assert per_length is not None and seed is not None
    if per_length < 1:
        raise ParityError("random-tokens: per_length must be >= 1")
    if len(ctx.ordinary_ids) == 0:
        raise ParityError("random-tokens: the tokenizer has no ordinary token ids to draw from")
    kept = sorted({n for n in lengths if ctx.max_length is None or n <= ctx.max_length})
    if not kept:
        raise ParityError(f"random-tokens: every length in {lengths} exceeds the limit {ctx.max_length}")
    rng = np.random.default_rng(seed)
    pool = np.asarray(ctx.ordinary_ids)
    corpus: dict[str, Item] = {}
    for n in kept:
        for j in range(per_length):
            corpus[f"random-{n}-{j}"] = tuple(int(t) for t in rng.choice(pool, size=n))
    info = {"seed": seed, "lengths": kept, "dropped_over_limit": sorted(set(lengths) - set(kept))}
    return Dataset("random-tokens", corpus, {}, {}, info)
