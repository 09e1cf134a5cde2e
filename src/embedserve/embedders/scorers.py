"""Rerankers in the shared spec grammar (docs/specs.md; read as "rerank"): each scores (query,
documents) in document order. `parity --task rerank` and `bench --scenario rerank` open them here.

    sentence-transformers:DIR   CrossEncoder.predict (sigmoid of the logit); ?dtype= ?device=
    hf:DIR                      transformers: a *ForSequenceClassification's sigmoid(logit), or
                                a causal LM as Qwen3-Reranker's model card scores it
                                (softmax over the last token's "yes" / "no" logits); ?dtype= ?device=
    engine:DIR?opts             Engine.rerank (engine options as every `engine:` spec; task=rerank)
    http://HOST:PORT?model=M    POST /v1/rerank of an embedserve server (or any peer of that shape);
                                the endpoint's key and extra fields as every `http://` spec
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from embedserve.embedders.errors import SourceError
from embedserve.embedders.spec import Spec, parse_spec

Scorer = Callable[[str, list[str]], list[float]]


def open_scorer(text: str, instruction: str | None = None) -> tuple[Scorer, Callable[[], None]]:
    """(score function, close) for a reranker spec."""
    spec = parse_spec(text, "rerank")
    if spec.kind == "http":
        return _http(spec, instruction)
    if spec.kind == "engine":
        from embedserve.embedders.engine import open_engine

        engine = open_engine(spec.location, spec.engine_options(task="rerank"))

        def score_engine(query: str, docs: list[str]) -> list[float]:
            res = engine.rerank(query, docs, instruction=instruction)
            return [r.relevance_score for r in sorted(res, key=lambda r: r.index)]

        return score_engine, engine.close
    from embedserve.embedders.sentence_transformers import reference_dtype

    _, dtype = reference_dtype(spec)
    device = spec.option("device") or "cpu"
    if spec.kind == "sentence-transformers":
        from sentence_transformers import CrossEncoder

        ce = CrossEncoder(spec.location, device=device, model_kwargs={"dtype": dtype})
        return lambda q, docs: [float(s) for s in ce.predict([(q, d) for d in docs])], lambda: None
    return _hf(Path(spec.location), instruction, dtype, device), lambda: None


def _hf(path: Path, instruction: str | None, dtype: Any, device: str) -> Scorer:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from embedserve.tokenizer.pairs import QWEN3_INSTRUCTION, QWEN3_PREFIX, QWEN3_SUFFIX

    tok = AutoTokenizer.from_pretrained(path)
    archs = json.loads((path / "config.json").read_text()).get("architectures") or []
    if any(a.endswith("ForSequenceClassification") for a in archs):
        clf: torch.nn.Module = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype)
        clf.to(device).eval()

        def score_clf(query: str, docs: list[str]) -> list[float]:
            enc = tok([query] * len(docs), docs, padding=True, truncation="only_second", return_tensors="pt")
            with torch.no_grad():
                return torch.sigmoid(clf(**enc.to(device)).logits[:, 0].float()).tolist()

        return score_clf
    lm: torch.nn.Module = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    lm.to(device).eval()
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    prefix = tok.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix = tok.encode(QWEN3_SUFFIX, add_special_tokens=False)

    def score_lm(query: str, docs: list[str]) -> list[float]:
        out = []
        for d in docs:  # one pair at a time: no padding to get right
            text = f"<Instruct>: {instruction or QWEN3_INSTRUCTION}\n<Query>: {query}\n<Document>: {d}"
            ids = prefix + tok.encode(text, add_special_tokens=False) + suffix
            with torch.no_grad():
                logits = lm(torch.tensor([ids], device=device)).logits[0, -1].float()
            out.append(float(torch.softmax(torch.stack([logits[yes], logits[no]]), 0)[0]))
        return out

    return score_lm


def _http(spec: Spec, instruction: str | None) -> tuple[Scorer, Callable[[], None]]:
    import httpx

    from embedserve.embedders.http import Endpoint

    endpoint = Endpoint(spec)
    client = httpx.Client(timeout=endpoint.timeout, headers=endpoint.headers)
    url = endpoint.base + "/rerank"

    def score_http(query: str, docs: list[str]) -> list[float]:
        body: dict[str, Any] = {**endpoint.extra, "query": query, "documents": docs}
        if endpoint.model:
            body["model"] = endpoint.model
        if instruction:
            body["instruction"] = instruction
        try:
            resp = client.post(url, json=body)
        except httpx.HTTPError as e:
            raise SourceError(f"{url}: {type(e).__name__}: {e}") from None
        if resp.status_code != 200:
            raise SourceError(f"{url} answered {resp.status_code}: {resp.text[:300]}")
        scores = [0.0] * len(docs)
        for r in resp.json()["results"]:
            scores[int(r["index"])] = float(r["relevance_score"])
        return scores

    return score_http, client.close
