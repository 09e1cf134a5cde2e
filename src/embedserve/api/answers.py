"""What a complete 200 answer of each route holds, for `n` inputs: a gateway checks each pool's
answer with its route's predicate (api/routes.py `Route.answers`) before it reassembles them."""

from __future__ import annotations

from typing import Any


def one_vector_per_input(body: Any, n: int) -> bool:
    data = body["data"]
    if not isinstance(data, list):
        return False
    indices = [d["index"] for d in data]
    if data and all("token_range" in d for d in data):  # one late-chunked document: its chunks,
        return n == 1 and indices == list(range(indices[0], indices[0] + len(indices)))  # a cut drops ends
    return sorted(indices) == list(range(n))


def one_vector_per_text(body: Any, n: int) -> bool:
    return all(len(vectors) == n for vectors in body["embeddings"].values())


def ranks_within(body: Any, n: int) -> bool:  # top_n may rank fewer than n documents
    results = body if isinstance(body, list) else body["results"]  # TEI's shape, Cohere's
    return all(0 <= item["index"] < n for item in results)


def one_answer_each(body: Any, n: int) -> bool:
    return isinstance(body["data"], list) and [d["index"] for d in body["data"]] == list(range(n))


def labels_of_each(body: Any, n: int) -> bool:  # TEI: one input's labels, or a list per input
    return isinstance(body, list) and (n == 1 or len(body) == n)


def tokens_of_each(body: Any, n: int) -> bool:  # vLLM's one input, TEI's list
    return len(body) == n if isinstance(body, list) else n == 1 and isinstance(body["tokens"], list)


def one_vector_each(body: Any, n: int) -> bool:
    return isinstance(body, list) and len(body) == n


def text(body: Any, n: int) -> bool:
    return isinstance(body["prompt"], str)


def one_score_each_sentence(body: Any, n: int) -> bool:  # TEI's /similarity: n - 1 sentences
    return isinstance(body, list) and len(body) == n - 1


def texts_of_each(body: Any, n: int) -> bool:  # TEI's /decode: one text per id list
    return isinstance(body, list) and len(body) == n and all(isinstance(t, str) for t in body)
