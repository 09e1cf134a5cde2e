"""Forced preemption of one long request on a small KV cache (the core stepped by hand): a
shared scenario for the poolings that must survive it."""

from __future__ import annotations

import time

import numpy as np

from embedserve.config import PoolingMethod
from embedserve.engine.core import EngineCore
from embedserve.request import EmbedParams, Priority, Request


def preempted_vector(core: EngineCore, doc: Request) -> np.ndarray:
    """`doc` (request id 0) runs five steps, then two 1,200-token online requests crowd it out of
    the cache; its result once everything finished. Asserts it was preempted mid-way."""
    core.add(doc)
    for _ in range(5):
        core.step()
    assert 0 < doc.num_computed_tokens < doc.num_prompt_tokens
    params = EmbedParams(normalize=True)
    for i in (1, 2):
        core.add(Request(i, list(range(1000, 2200)), params, PoolingMethod.LAST, Priority.ONLINE))
    vectors = {}
    deadline = time.monotonic() + 120
    while core.has_work and time.monotonic() < deadline:
        for fin in core.step():
            assert fin.error is None and fin.vector is not None
            vectors[fin.request.request_id] = fin.vector.numpy()
    assert doc.num_preemptions > 0
    return vectors[0]
