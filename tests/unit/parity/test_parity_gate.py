"""The gate: documented defaults, per-bucket overrides, profiles, refusals; spec parsing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from embedserve.parity.gate import Gate
from embedserve.parity.options import Options, ParityError, split_dataset_list, split_spec


def _entry(p50: float, p01: float, overlap: float | None = None, regression: float = 0.0) -> dict[str, Any]:
    e: dict[str, Any] = {"vector_cosine": {"p50": p50, "p01": p01, "min": p01, "count": 10}}
    if overlap is not None:
        e["top10_overlap"] = {"mean": overlap, "worst": 0.5, "worst_query": "q", "count": 4}
        e["retrieval"] = {
            m: {"reference": 0.5, "candidate": 0.5 - regression, "regression": regression}
            for m in ("ndcg@10", "recall@10", "recall@100")
        }
    return e


def _failed(checks: list[Any]) -> set[str]:
    return {c.metric for c in checks if not c.passed}


def test_defaults_are_the_documented_ones() -> None:
    gate = Gate()
    t = gate.thresholds("overall")
    assert t["vector_cosine"] == {"p50": 0.9999, "p01": 0.9990}
    assert t["top10_overlap"] == {"min": 0.98} and t["retrieval_recall"] == {"regression_max": 0.005}
    assert _failed(gate.check_bucket("d/overall", "overall", _entry(0.99995, 0.9991, 0.99, 0.004))) == set()
    failed = _failed(gate.check_bucket("d/overall", "overall", _entry(0.9998, 0.998, 0.95, 0.01)))
    assert failed == {
        "vector_cosine.p50",
        "vector_cosine.p01",
        "top10_overlap.mean",
        "recall@10.regression",
        "recall@100.regression",
    }


def test_the_overlap_bound_reads_the_mean_not_the_worst_query() -> None:
    checks = Gate().check_bucket("d/0-1K", "0-1K", _entry(1.0, 1.0, overlap=0.99))  # worst query 0.5
    assert all(c.passed for c in checks)


def test_bucket_overrides_and_profiles(tmp_path: Path) -> None:
    path = tmp_path / "gate.yaml"
    path.write_text(
        "embedding_gate:\n"
        "  vector_cosine: {p50: 0.999}\n"
        "  ndcg_at_10: {regression_max: 0.01}\n"
        "  buckets:\n"
        "    8K-16K: {vector_cosine: {p01: 0.99}}\n"
        "  profiles:\n"
        "    loose: {top10_overlap: {min: 0.5}, buckets: {0-1K: {vector_cosine: {min: 0.9}}}}\n"
    )
    gate = Gate.load(str(path))
    assert gate.thresholds("0-1K")["vector_cosine"] == {"p50": 0.999, "p01": 0.999}
    assert gate.thresholds("8K-16K")["vector_cosine"] == {"p50": 0.999, "p01": 0.99}
    assert "ndcg@10.regression" in _failed(gate.check_bucket("d/x", "0-1K", _entry(1, 1, 1.0, 0.02)))
    loose = Gate.load(str(path), "loose")
    assert loose.thresholds("0-1K")["vector_cosine"]["min"] == 0.9
    assert loose.thresholds("1K-4K")["top10_overlap"] == {"min": 0.5}
    multimodal = Gate.load(str(path), "multimodal")  # built in
    assert multimodal.thresholds("overall")["vector_cosine"]["p01"] == 0.995
    assert multimodal.thresholds("overall")["vector_cosine"]["p50"] == 0.999
    assert multimodal.effective()["profile"] == "multimodal"


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("embedding_gate:\n  vector_cosin: {p50: 1}\n", "unknown section 'vector_cosin'"),
        ("embedding_gate:\n  vector_cosine: {p99: 1}\n", "unknown key vector_cosine.p99"),
        ("embedding_gate:\n  vector_cosine: {p50: high}\n", "must be a number"),
        ("embedding_gate:\n  buckets: {2K-3K: {}}\n", "unknown bucket '2K-3K'"),
        ("gate:\n  vector_cosine: {}\n", "expected embedding_gate"),
        ("embedding_gate: [1, 2\n", "not valid YAML"),
    ],
)
def test_bad_gate_files_are_refused(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "gate.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ParityError, match=message):
        Gate.load(str(path))


def test_unknown_profile_and_missing_file() -> None:
    with pytest.raises(ParityError, match="unknown profile 'video'"):
        Gate(None, "video")
    with pytest.raises(ParityError, match="cannot read"):
        Gate.load("/nonexistent/gate.yaml")


def test_preemption_checks() -> None:
    checks = Gate().check_preemption({"min_cosine": 0.9995, "preemptions": 0})
    assert {c.metric: c.passed for c in checks} == {"min_cosine": True, "preemptions": False}


def test_spec_parsing() -> None:
    assert split_spec("engine:/m?dtype=bfloat16&max_num_batched_tokens=512") == (
        "engine:/m",
        {"dtype": "bfloat16", "max_num_batched_tokens": "512"},
    )
    with pytest.raises(ParityError, match="given twice"):
        split_spec("engine:/m?dtype=a&dtype=b")
    assert split_dataset_list(["cranfield,passkey?lengths=256,1024,16K&per_length=2", "peps"]) == [
        "cranfield",
        "passkey?lengths=256,1024,16K&per_length=2",
        "peps",
    ]
    opts = Options("x", {"lengths": "256:16K", "flag": "no", "n": "3"})
    assert opts.integers("lengths", []) == [256, 16384] and opts.flag("flag") is False
    with pytest.raises(ParityError, match=r"unknown option\(s\) n; known: flag, lengths"):
        opts.finish()
