"""Bench inputs: exact token lengths in the model tokenizer, --mix parsing and drawing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from embedserve.bench.inputs import TextMaker, draw_mix_lengths, parse_lengths, parse_mix
from embedserve.errors import InvalidInputError
from embedserve.lengths import bucket_of
from tests.helpers.shared_data import SHARED_DATA, needs_shared_data


def test_parse_mix_normalizes_and_orders_buckets() -> None:
    mix = parse_mix("8K-16K:1,0-1K:4,1K-4K:3,4K-8K:2")
    assert [b for b, _ in mix] == ["0-1K", "1K-4K", "4K-8K", "8K-16K"]
    assert [w for _, w in mix] == pytest.approx([0.4, 0.3, 0.2, 0.1])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0-1K", "BUCKET:WEIGHT"),
        ("0-2K:1", "unknown length bucket"),
        ("0-1K:x", "not a number"),
        ("0-1K:0", "positive"),
        ("0-1K:1,0-1K:2", "twice"),
    ],
)
def test_parse_mix_rejects_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        parse_mix(spec)


def test_parse_lengths() -> None:
    assert parse_lengths("512, 2048") == [512, 2048]
    with pytest.raises(InvalidInputError):
        parse_lengths("512,abc")
    with pytest.raises(InvalidInputError):
        parse_lengths("0")


def test_mix_draws_stay_in_their_bucket_with_the_weights() -> None:
    mix = parse_mix("0-1K:0.4,1K-4K:0.3,4K-8K:0.2,8K-16K:0.1")
    lengths = draw_mix_lengths(mix, 4000, np.random.default_rng(0), min_tokens=16, max_tokens=16384)
    assert min(lengths) >= 16 and max(lengths) <= 16384
    share = {b: sum(bucket_of(n) == b for n in lengths) / len(lengths) for b, _ in mix}
    for b, w in mix:
        assert share[b] == pytest.approx(w, abs=0.03)
    # log-uniform inside 0-1K: about half of the draws fall below the geometric mean sqrt(16 * 1024)
    small = [n for n in lengths if n <= 1024]
    assert np.mean(np.array(small) <= 128) == pytest.approx(0.5, abs=0.06)
    with pytest.raises(InvalidInputError, match="no lengths"):
        draw_mix_lengths(mix, 10, np.random.default_rng(0), min_tokens=16, max_tokens=2000)


@pytest.mark.parametrize(
    "source", ["random", "pydocs", pytest.param("peps", marks=needs_shared_data("peps"))]
)
def test_texts_have_exact_token_counts_in_the_model_tokenizer(qwen3_dir: Path, source: str) -> None:
    maker = TextMaker(qwen3_dir / "tokenizer.json", source, SHARED_DATA)
    reference = Tokenizer.from_file(str(qwen3_dir / "tokenizer.json"))
    lengths = [2, 3, 17, 512, 1500, 9000]
    w = maker.workload("x", lengths, seed=7)
    assert [len(reference.encode(t).ids) for t in w.texts] == lengths
    assert all(reference.encode(t).ids[-1] == 151643 for t in w.texts)  # EOS appended by the tokenizer
    assert maker.workload("x", lengths, seed=7).texts == w.texts  # fixed seed: same inputs
    assert maker.workload("x", lengths, seed=8).texts != w.texts
    with pytest.raises(InvalidInputError, match="no room"):
        maker.make(1, np.random.default_rng(0))
