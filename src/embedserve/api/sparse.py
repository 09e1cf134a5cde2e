"""Sparse vectors in answers: a SPLADE model's vocabulary-sized weight vector as its non-zero
entries (`{"indices": [...], "values": [...]}`, indices ascending and unique; `sparse_top_k`: the
k largest only), with the tokens of those indices on request, and TEI's `/embed_sparse` shape
(`[{"index": i, "value": v}, ...]` per input)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def nonzero(vector: np.ndarray, top_k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(indices ascending, values) of the non-zero entries; `top_k`: the k largest (ties: the
    lower index first)."""
    idx = np.flatnonzero(vector)
    if top_k is not None and idx.size > top_k:
        vals = vector[idx]
        keep = np.sort(idx[np.argsort(-vals, kind="stable")[:top_k]])
        idx = keep
    return idx, vector[idx].astype(np.float32, copy=False)


def sparse_item(
    vector: np.ndarray, top_k: int | None = None, token: Callable[[int], str | None] | None = None
) -> dict[str, Any]:
    """One input's `embedding` in `/v1/embeddings`' sparse answer."""
    idx, vals = nonzero(vector, top_k)
    item: dict[str, Any] = {"indices": idx.tolist(), "values": vals.tolist()}
    if token is not None:
        item["tokens"] = [token(int(i)) or "" for i in idx]
    return item


def tei_sparse(vector: np.ndarray) -> list[dict[str, Any]]:
    """One input's answer in TEI's `/embed_sparse` shape."""
    idx, vals = nonzero(vector)
    return [{"index": int(i), "value": float(v)} for i, v in zip(idx, vals, strict=True)]
