"""One parity run: open both backends, embed every dataset on both sides, evaluate, gate, report."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.embedders.modeldir import TokenCounter, model_prompts, tokenizer_dir
from embedserve.parity.backends import Backend, open_backend
from embedserve.parity.cache import VectorCache
from embedserve.parity.datasets import Dataset, DatasetContext, check_dataset, find_data_dir, load_dataset
from embedserve.parity.embedding import Timing, embed_side, measure
from embedserve.parity.evaluate import Vectors, evaluate
from embedserve.parity.gate import Check, Gate
from embedserve.parity.options import ParityError
from embedserve.parity.scenarios import run_preemption


@dataclass(frozen=True)
class Settings:
    reference: str
    candidate: str
    datasets: list[str]
    scenario: str | None = None
    scenario_length: int = 15_500
    scenario_seed: int = 0
    gate: str | None = None
    gate_profile: str | None = None
    data_dir: str | None = None
    query_prompt: str | None = None
    document_prompt: str | None = None
    reference_cache: Path | None = None
    progress: bool = True


@dataclass
class Outcome:
    report: dict[str, Any]
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


def _length_counter(sides: list[Backend]) -> TokenCounter:
    for side in sides:
        if side.model_dir is not None and tokenizer_dir(side.model_dir) is not None:
            return TokenCounter(side.model_dir)
    raise ParityError(
        "token lengths need a local tokenizer: neither backend has a model directory with tokenizer.json "
        "(give an http backend ?tokenizer=MODEL_DIR)"
    )


def _prompts(settings: Settings, sides: list[Backend]) -> tuple[str, str]:
    """Query and document prompts, identical for both sides (the first local model's, or given)."""
    found: dict[str, str] = {}
    for side in sides:
        if side.model_dir is not None and side.model_dir.is_dir():
            found = model_prompts(side.model_dir)
            break
    query = settings.query_prompt if settings.query_prompt is not None else found.get("query", "")
    document = settings.document_prompt if settings.document_prompt is not None else found.get("document", "")
    return query, document


def _spread(values: list[int]) -> dict[str, int]:
    if not values:
        return {}
    return {"min": min(values), "median": int(np.median(values)), "max": max(values)}


@dataclass(frozen=True)
class _Job:
    """What both sides of one dataset are fed."""

    ds: Dataset
    prompts: tuple[str, str]  # (query, document)
    doc_len: list[int]
    query_len: list[int]
    limit: int | None
    progress: bool
    cache: VectorCache | None  # reference vectors from earlier runs

    def embed(self, side: str, backend: Backend) -> tuple[Vectors, Timing]:
        query_prompt, doc_prompt = self.prompts
        docs, queries = list(self.ds.corpus.values()), list(self.ds.queries.values())
        name = f"{self.ds.name} {side}"
        cache = self.cache if side == "reference" else None  # a candidate is always computed
        d, t = embed_side(
            backend, docs, doc_prompt, self.doc_len, self.limit, f"{name} docs", self.progress, cache
        )
        q = np.zeros((0, d.shape[1]), np.float32)
        if queries:
            prompt, lengths = query_prompt, self.query_len
            q, tq = embed_side(
                backend,
                queries,
                prompt,
                lengths,
                self.limit,
                f"{name} queries",
                self.progress,
                cache,
                "query",
            )
            t.add(tq)
        return Vectors(d, q), t


def _run_dataset(job: _Job, sides: dict[str, Backend], gate: Gate) -> tuple[dict[str, Any], list[Check]]:
    ds = job.ds
    vectors: dict[str, Vectors] = {}
    timings: dict[str, dict[str, float]] = {}
    for side, backend in sides.items():
        vectors[side], timing = job.embed(side, backend)
        timings[side] = timing.as_dict()
    entry: dict[str, Any] = {
        "name": ds.name,
        "num_docs": len(ds.corpus),
        "num_queries": len(ds.queries),
        "num_judged_queries": len(ds.qrels),
        "prompts": {"query": job.prompts[0], "document": job.prompts[1]},
        "lengths": {"docs": _spread(job.doc_len), "queries": _spread(job.query_len), "limit": job.limit},
        "timing": timings,
        "info": ds.info,
    }
    ref_dim, cand_dim = vectors["reference"].docs.shape[1], vectors["candidate"].docs.shape[1]
    if ref_dim != cand_dim:
        check = Check(ds.name, "dimensions", float(cand_dim), "==", float(ref_dim), False)
        return entry, [check]
    sparse = any(b.sparse for b in sides.values())  # SPLADE: non-zero sets, inner-product search
    results = evaluate(
        ds, job.doc_len, job.query_len, job.limit, vectors["reference"], vectors["candidate"], sparse
    )
    entry["buckets"] = results
    checks = [c for b, e in results.items() for c in gate.check_bucket(f"{ds.name}/{b}", b, e)]
    return entry, checks


def run(settings: Settings) -> Outcome:
    if not settings.datasets and not settings.scenario:
        raise ParityError("nothing to do: pass --dataset and/or --scenario")
    if settings.scenario not in (None, "preemption"):
        raise ParityError(f"unknown scenario {settings.scenario!r}; available: preemption")
    gate = Gate.load(settings.gate, settings.gate_profile)
    for spec in settings.datasets:
        check_dataset(spec)
    started = time.time()
    # The candidate first: its spec carries most options, so typos fail before the slow reference loads.
    cand = open_backend(settings.candidate)
    try:
        ref = open_backend(settings.reference)
    except BaseException:
        cand.close()
        raise
    try:
        outcome = _run_all(settings, gate, ref, cand)
        outcome.report["reference"] = ref.describe()
        outcome.report["candidate"] = cand.describe()
    finally:
        ref.close()
        cand.close()
    outcome.report["started"] = dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat()
    outcome.report["duration_s"] = round(time.time() - started, 1)
    outcome.report["passed"] = outcome.passed
    outcome.report["checks"] = [c.as_dict() for c in outcome.checks]
    return outcome


def _run_all(settings: Settings, gate: Gate, ref: Backend, cand: Backend) -> Outcome:
    sides = [ref, cand]
    counter = _length_counter(sides)
    prompts = _prompts(settings, sides)
    known = [s.max_length for s in sides if s.max_length]
    limit = min(known) if known else None
    cache = VectorCache(settings.reference_cache) if settings.reference_cache else None
    data_dir = find_data_dir(settings.data_dir)
    images = counter.image_tokens if counter.image is not None else None
    ctx = DatasetContext(data_dir, counter.count, counter.ordinary_ids, limit, settings.progress, images)
    head = {"tool": "embedserve parity", "gate": gate.effective(), "length_tokenizer": counter.source}
    outcome = Outcome({**head, "datasets": {}})
    total = {"reference": Timing(), "candidate": Timing()}
    for spec in settings.datasets:
        ds = load_dataset(spec, ctx)
        doc_len = measure(counter, list(ds.corpus.values()), prompts[1])
        query_len = measure(counter, list(ds.queries.values()), prompts[0])
        job = _Job(ds, prompts, doc_len, query_len, limit, settings.progress, cache)
        entry, checks = _run_dataset(job, {"reference": ref, "candidate": cand}, gate)
        entry["spec"] = spec
        key = ds.name if ds.name not in outcome.report["datasets"] else spec
        outcome.report["datasets"][key] = entry
        outcome.checks += checks
        for side in total:
            t = entry["timing"][side]
            total[side].add(Timing(t["seconds"], int(t["tokens"]), int(t["cached_items"])))
    outcome.report["timing"] = {side: t.as_dict() for side, t in total.items()}
    if settings.scenario == "preemption":
        length, seed = settings.scenario_length, settings.scenario_seed
        result = run_preemption(ref, cand, counter.ordinary_ids, length, seed, settings.progress)
        outcome.report["scenarios"] = {"preemption": result}
        outcome.checks += gate.check_preemption(result)
    return outcome
