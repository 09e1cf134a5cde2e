"""The release gate: thresholds from YAML (defaults, per-bucket overrides, profiles) and checks.

```yaml
embedding_gate:
  vector_cosine: {p50: 0.9999, p01: 0.9990}   # lower bounds (also: min)
  top10_overlap: {min: 0.98}                  # bounds the MEAN overlap over queries
  retrieval_recall: {regression_max: 0.005}   # Recall@10 and @100, reference - candidate
  ndcg_at_10: {regression_max: 0.01}          # optional
  preemption: {cosine_min: 0.999, preemptions_min: 1}
  buckets:                                    # per length bucket (or `overall`) overrides
    8K-16K: {vector_cosine: {p01: 0.998}}
  profiles:                                   # chosen with --gate-profile
    multimodal: {vector_cosine: {p01: 0.995, p50: 0.999}}  # built in; a file may redefine it
```
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from embedserve.lengths import BUCKET_NAMES
from embedserve.parity.evaluate import OVERALL, SPARSE
from embedserve.parity.options import ParityError

Thresholds = dict[str, dict[str, float]]

DEFAULTS: Thresholds = {
    "vector_cosine": {"p50": 0.9999, "p01": 0.9990},
    "top10_overlap": {"min": 0.98},
    "retrieval_recall": {"regression_max": 0.005},
    "sparse_index_jaccard": {"p01": 0.99},  # sparse vectors: their non-zero id sets (per vector)
    "preemption": {"cosine_min": 0.999, "preemptions_min": 1},
}
SECTIONS: dict[str, tuple[str, ...]] = {
    "vector_cosine": ("p50", "p01", "min"),
    "top10_overlap": ("min",),
    "retrieval_recall": ("regression_max",),
    "ndcg_at_10": ("regression_max",),
    "sparse_index_jaccard": ("p50", "p01", "min"),
    "preemption": ("cosine_min", "preemptions_min"),
}
# text + image (issue 22): p01 >= 0.995 and p50 >= 0.999. int8 projections (issue 64,
# docs/quantization.md): another vector space, so the p01 and retrieval bounds hold and p50, the
# lowest vector and top-10 overlap are bounded where int8 lands on a model that quantizes well.
BUILTIN_PROFILES: dict[str, dict[str, Any]] = {
    "multimodal": {"vector_cosine": {"p01": 0.995, "p50": 0.999}},
    "int8": {
        "vector_cosine": {"p50": 0.999, "p01": 0.999, "min": 0.995},
        "top10_overlap": {"min": 0.95},
        "ndcg_at_10": {"regression_max": 0.005},
    },
}
SCOPES = (*BUCKET_NAMES, OVERALL)  # what a gate's `buckets:` may override


@dataclass(frozen=True)
class Check:
    scope: str  # dataset/bucket or scenario name
    metric: str  # e.g. vector_cosine.p01
    value: float
    op: str  # ">=" or "<="
    bound: float
    passed: bool

    def describe(self) -> str:
        mark = "ok  " if self.passed else "FAIL"
        return f"{mark} {self.scope}: {self.metric} = {self.value:.6f} (must be {self.op} {self.bound:g})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sections(raw: Any, where: str) -> Thresholds:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ParityError(f"gate: {where} must be a mapping")
    out: Thresholds = {}
    for section, values in raw.items():
        if section not in SECTIONS:
            raise ParityError(f"gate: unknown section {section!r} in {where}; known: {', '.join(SECTIONS)}")
        if not isinstance(values, dict):
            raise ParityError(f"gate: {where}.{section} must be a mapping")
        for key, value in values.items():
            if key not in SECTIONS[section]:
                known = ", ".join(SECTIONS[section])
                raise ParityError(f"gate: unknown key {section}.{key} in {where}; known: {known}")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ParityError(f"gate: {where}.{section}.{key} must be a number, got {value!r}")
            out.setdefault(section, {})[key] = float(value)
    return out


def _split_level(raw: Any, where: str) -> tuple[Thresholds, dict[str, Thresholds]]:
    """A level holds sections plus an optional `buckets` mapping of per-bucket sections."""
    if raw is None:
        return {}, {}
    if not isinstance(raw, dict):
        raise ParityError(f"gate: {where} must be a mapping")
    body = {k: v for k, v in raw.items() if k not in ("buckets", "profiles")}
    buckets_raw = raw.get("buckets") or {}
    if not isinstance(buckets_raw, dict):
        raise ParityError(f"gate: {where}.buckets must be a mapping")
    buckets: dict[str, Thresholds] = {}
    for name, sections in buckets_raw.items():
        if str(name) not in SCOPES:
            raise ParityError(f"gate: unknown bucket {name!r} in {where}; known: {', '.join(SCOPES)}")
        buckets[str(name)] = _sections(sections, f"{where}.buckets.{name}")
    return _sections(body, where), buckets


def _merge(base: Thresholds, over: Thresholds) -> Thresholds:
    out = copy.deepcopy(base)
    for section, values in over.items():
        out.setdefault(section, {}).update(values)
    return out


class Gate:
    def __init__(self, raw: dict[str, Any] | None = None, profile: str | None = None) -> None:
        raw = raw or {}
        unknown = set(raw) - {"embedding_gate"}
        if unknown:
            raise ParityError(f"gate: unknown top-level key(s) {sorted(unknown)}; expected embedding_gate")
        body = raw.get("embedding_gate") or {}
        base, buckets = _split_level(body, "embedding_gate")
        own_profiles = (body.get("profiles") or {}) if isinstance(body, dict) else {}
        profiles_raw = {**BUILTIN_PROFILES, **own_profiles}
        self.profile = profile
        if profile is not None:
            if profile not in profiles_raw:
                known = ", ".join(sorted(profiles_raw))
                raise ParityError(f"gate: unknown profile {profile!r}; known: {known}")
            p_base, p_buckets = _split_level(profiles_raw[profile], f"profiles.{profile}")
        else:
            p_base, p_buckets = {}, {}
        self.base = _merge(_merge(DEFAULTS, base), p_base)
        self.buckets = {name: _merge(buckets.get(name, {}), p_buckets.get(name, {})) for name in SCOPES}

    @classmethod
    def load(cls, path: str | None, profile: str | None = None) -> Gate:
        if path is None:
            return cls(None, profile)
        try:
            raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise ParityError(f"gate: cannot read {path}: {e}") from None
        except yaml.YAMLError as e:
            raise ParityError(f"gate: {path} is not valid YAML: {e}") from None
        if raw is not None and not isinstance(raw, dict):
            raise ParityError(f"gate: {path} must hold a mapping with an embedding_gate key")
        return cls(raw, profile)

    def thresholds(self, bucket: str) -> Thresholds:
        return _merge(self.base, self.buckets.get(bucket, {}))

    def effective(self) -> dict[str, Any]:
        """Every threshold in force, per bucket (for the report)."""
        overridden = {b: self.thresholds(b) for b in SCOPES if self.buckets[b]}
        return {"profile": self.profile, "default": self.base, "buckets": overridden}

    def check_bucket(self, scope: str, bucket: str, entry: dict[str, Any]) -> list[Check]:
        t = self.thresholds(bucket)
        checks: list[Check] = []

        def at_least(metric: str, value: float, bound: float) -> None:
            checks.append(Check(scope, metric, value, ">=", bound, value >= bound))

        def at_most(metric: str, value: float, bound: float) -> None:
            checks.append(Check(scope, metric, value, "<=", bound, value <= bound))

        cos = entry.get("vector_cosine", {})
        if cos.get("count"):
            for key, bound in t.get("vector_cosine", {}).items():
                at_least(f"vector_cosine.{key}", cos[key], bound)
        jaccard = entry.get(SPARSE, {}).get("index_jaccard", {})
        if jaccard.get("count"):
            for key, bound in t.get("sparse_index_jaccard", {}).items():
                at_least(f"sparse_index_jaccard.{key}", jaccard[key], bound)
        overlap = entry.get("top10_overlap")
        if overlap and "min" in t.get("top10_overlap", {}):
            at_least("top10_overlap.mean", overlap["mean"], t["top10_overlap"]["min"])
        retrieval = entry.get("retrieval")
        if retrieval:
            if "regression_max" in t.get("retrieval_recall", {}):
                for m in ("recall@10", "recall@100"):
                    bound = t["retrieval_recall"]["regression_max"]
                    at_most(f"{m}.regression", retrieval[m]["regression"], bound)
            if "regression_max" in t.get("ndcg_at_10", {}):
                bound = t["ndcg_at_10"]["regression_max"]
                at_most("ndcg@10.regression", retrieval["ndcg@10"]["regression"], bound)
        return checks

    def check_preemption(self, result: dict[str, Any]) -> list[Check]:
        t = self.base["preemption"]
        scope = "scenario/preemption"
        checks = []
        if "cosine_min" in t:
            v = result["min_cosine"]
            checks.append(Check(scope, "min_cosine", v, ">=", t["cosine_min"], v >= t["cosine_min"]))
        if "preemptions_min" in t:
            n = float(result["preemptions"])
            bound = t["preemptions_min"]
            checks.append(Check(scope, "preemptions", n, ">=", bound, n >= bound))
        return checks
