"""`embedserve serve --deterministic`: the bytes a client gets do not depend on what else the
server was doing, and equal the in-process engine's in deterministic mode."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from embedserve import Engine
from tests.helpers.reference import random_ids
from tests.helpers.server_process import ServerProcess, start_server

PROBE = [random_ids(n, seed=n) for n in (3, 200, 700, 2500)]
SIZES = [np.random.default_rng(k).integers(1, 2000, 6) for k in range(4)]
FLOOD = [[random_ids(int(n), seed=50 + i) for i, n in enumerate(sizes)] for sizes in SIZES]


@pytest.fixture(scope="module")
def det_server(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(
        qwen3_dir, tmp_path_factory.mktemp("det-logs"), "--deterministic", "--max-num-batched-tokens", "512"
    )
    try:
        server.wait_ready()
        yield server
    finally:
        assert server.terminate() == 0, server.log()


def _embed(client: httpx.Client, inputs: list[list[int]]) -> tuple[list[bytes], str]:
    reply = client.post("/v1/embeddings", json={"input": inputs, "encoding_format": "base64"})
    reply.raise_for_status()
    body = reply.json()
    return [base64.b64decode(d["embedding"]) for d in body["data"]], body["backend_profile"]


def test_served_bytes_ignore_the_load_and_equal_the_engine(
    det_server: ServerProcess, qwen3_dir: Path
) -> None:
    with httpx.Client(base_url=det_server.base_url, timeout=120) as client:
        alone = [_embed(client, [ids])[0][0] for ids in PROBE]
        with ThreadPoolExecutor(4) as pool:  # the probe again, while other clients flood the server
            floods = [pool.submit(_embed, client, batch) for batch in FLOOD]
            loaded, profile = _embed(client, FLOOD[0][:3] + PROBE)
            for f in floods:
                f.result()
    assert profile == "cpu-fp32-det"
    assert loaded[3:] == alone
    with Engine.from_pretrained(qwen3_dir, deterministic=True, max_num_batched_tokens=2048) as engine:
        want = [np.asarray(v, dtype="<f4").tobytes() for v in engine.embed(PROBE)]
    assert alone == want
