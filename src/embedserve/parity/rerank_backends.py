"""Reranker backends of `embedserve parity --task rerank`: each scores (query, documents) in
document order.

    sentence-transformers:DIR   CrossEncoder.predict (sigmoid of the logit), float32
    hf:DIR                      transformers: a *ForSequenceClassification's sigmoid(logit), or
                                a causal LM as Qwen3-Reranker's model card scores it
                                (softmax over the last token's "yes" / "no" logits)
    engine:DIR?opts             Engine.rerank (options as `engine:` embedding backends)
    http://HOST:PORT?model=M    POST /v1/rerank of an embedserve server (or any peer of that shape)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from embedserve.parity.options import Options, ParityError, split_spec

Scorer = Callable[[str, list[str]], list[float]]


def open_scorer(spec: str, instruction: str | None = None) -> tuple[Scorer, Callable[[], None]]:
    """(score function, close) for a backend spec."""
    head, raw = split_spec(spec)
    opts = Options(f"backend {head}", raw)
    if head.startswith(("http://", "https://")):
        return _http(head, opts, instruction)
    kind, sep, path = head.partition(":")
    if not sep or not Path(path).exists():
        raise ParityError(f"backend {spec!r}: expected KIND:MODEL_DIR with an existing directory")
    if kind == "engine":
        from embedserve.engine.engine import Engine
        from embedserve.parity.backends.engine import engine_options

        engine = Engine.from_pretrained(path, **{"task": "rerank", **engine_options(opts)})
        opts.finish()

        def score_engine(query: str, docs: list[str]) -> list[float]:
            res = engine.rerank(query, docs, instruction=instruction)
            return [r.relevance_score for r in sorted(res, key=lambda r: r.index)]

        return score_engine, engine.close
    opts.finish()
    if kind == "sentence-transformers":
        from sentence_transformers import CrossEncoder

        ce = CrossEncoder(path, device="cpu")
        return lambda q, docs: [float(s) for s in ce.predict([(q, d) for d in docs])], lambda: None
    if kind == "hf":
        return _hf(Path(path), instruction), lambda: None
    raise ParityError(f"unknown rerank backend {kind!r}: sentence-transformers, hf, engine or http://")


def _hf(path: Path, instruction: str | None) -> Scorer:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from embedserve.pairs import QWEN3_INSTRUCTION, QWEN3_PREFIX, QWEN3_SUFFIX

    tok = AutoTokenizer.from_pretrained(path)
    archs = json.loads((path / "config.json").read_text()).get("architectures") or []
    if any(a.endswith("ForSequenceClassification") for a in archs):
        clf: torch.nn.Module = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
        clf.eval()

        def score_clf(query: str, docs: list[str]) -> list[float]:
            enc = tok([query] * len(docs), docs, padding=True, truncation="only_second", return_tensors="pt")
            with torch.no_grad():
                return torch.sigmoid(clf(**enc).logits[:, 0]).tolist()

        return score_clf
    lm: torch.nn.Module = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lm.eval()
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    prefix = tok.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix = tok.encode(QWEN3_SUFFIX, add_special_tokens=False)

    def score_lm(query: str, docs: list[str]) -> list[float]:
        out = []
        for d in docs:  # one pair at a time: no padding to get right
            text = f"<Instruct>: {instruction or QWEN3_INSTRUCTION}\n<Query>: {query}\n<Document>: {d}"
            ids = prefix + tok.encode(text, add_special_tokens=False) + suffix
            with torch.no_grad():
                logits = lm(torch.tensor([ids])).logits[0, -1]
            out.append(float(torch.softmax(torch.stack([logits[yes], logits[no]]), 0)[0]))
        return out

    return score_lm


def _http(url: str, opts: Options, instruction: str | None) -> tuple[Scorer, Callable[[], None]]:
    import httpx

    model = opts.text("model")
    timeout = float(opts.text("timeout", "600") or 600)
    opts.finish()
    client = httpx.Client(timeout=timeout)
    base = url.rstrip("/").removesuffix("/v1")

    def score_http(query: str, docs: list[str]) -> list[float]:
        body: dict[str, Any] = {"query": query, "documents": docs}
        if model:
            body["model"] = model
        if instruction:
            body["instruction"] = instruction
        resp = client.post(f"{base}/v1/rerank", json=body)
        if resp.status_code != 200:
            raise ParityError(f"{url}/v1/rerank answered {resp.status_code}: {resp.text[:300]}")
        scores = [0.0] * len(docs)
        for r in resp.json()["results"]:
            scores[int(r["index"])] = float(r["relevance_score"])
        return scores

    return score_http, client.close
