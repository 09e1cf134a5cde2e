"""The default model on real retrieval data: all-MiniLM-L6-v2, engine fp32 vs sentence-transformers.

Every Cranfield document (1,400, truncated at max_seq_length 256 as sentence-transformers does)
and every query (225): per-vector cosine, top-10 rankings and nDCG@10 must agree.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from embedserve import Engine
from embedserve.errors import InputTooLongError
from embedserve.models import default_model_path
from tests.helpers.cranfield import Cranfield
from tests.helpers.cranfield import load as load_cranfield
from tests.helpers.engine_calls import embed_outputs
from tests.helpers.reference import cosine, st_embed
from tests.helpers.shared_data import needs_shared_data


def ndcg_at_10(ranking: list[int], gains: dict[int, int]) -> float:
    dcg = sum(gains.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranking[:10]))
    ideal = sorted(gains.values(), reverse=True)[:10]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def top10(queries: np.ndarray, docs: np.ndarray) -> list[list[int]]:
    scores = queries.astype(np.float64) @ docs.astype(np.float64).T  # both L2-normalized
    return [list(np.argsort(-row, kind="stable")[:10]) for row in scores]


def mean_ndcg(rankings: list[list[int]], data: Cranfield) -> float:
    return float(np.mean([ndcg_at_10(rankings[q], data.qrels.get(q, {})) for q in range(len(rankings))]))


@needs_shared_data("cranfield")
def test_engine_matches_sentence_transformers_on_cranfield() -> None:
    data = load_cranfield()
    assert len(data.docs) == 1400 and len(data.queries) == 225
    path = default_model_path()
    with Engine.from_pretrained(path, max_num_batched_tokens=8192) as engine:
        assert engine.config.scheduler.max_model_len == 256  # sentence_bert_config's max_seq_length
        # Two Cranfield documents are empty: embed what sentence-transformers feeds the model
        # for "", the tokenizer's [CLS] [SEP], as token ids.
        empty = engine.tokenizer.backend.encode("").ids
        items = [d if d else empty for d in data.docs]
        docs = engine.embed(items, truncate="end")
        queries = engine.embed(data.queries, truncate="end")
    ref_docs = st_embed(path, data.docs, batch_size=32)
    ref_queries = st_embed(path, data.queries, batch_size=32)
    cos = cosine(np.concatenate([docs, queries]), np.concatenate([ref_docs, ref_queries]))
    assert cos.min() >= 0.99999, f"min cosine {cos.min():.7f} at vector {int(cos.argmin())}"
    ours, theirs = top10(queries, docs), top10(ref_queries, ref_docs)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(ours)
    assert same >= 0.98, f"identical top-10 for only {same:.1%} of queries"
    ndcg, ref_ndcg = mean_ndcg(ours, data), mean_ndcg(theirs, data)
    assert abs(ndcg - ref_ndcg) <= 0.001, (ndcg, ref_ndcg)
    assert ndcg > 0.2  # a real retriever: a broken model or qrels mapping scores near 0


def test_minilm_input_over_its_limit_is_refused_clearly() -> None:
    long_text = "aerodynamic " * 300
    with Engine.from_pretrained(default_model_path()) as engine:
        with pytest.raises(InputTooLongError, match="input 0: 302 tokens exceed the limit of 256 tokens"):
            engine.embed([long_text], truncate="error")
        cut = embed_outputs(engine, [long_text], truncate="end")[0]
        assert cut.truncated and cut.num_tokens == 256
