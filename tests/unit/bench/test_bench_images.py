"""`embedserve bench --images-per-input N --image-size WxH`: inputs of text + N synthetic images,
sent by the engine and http targets, their token counts including the image tokens."""

from __future__ import annotations

import asyncio
import csv
import io
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from tokenizers import Tokenizer

from embedserve.bench.config import BenchConfig
from embedserve.bench.engine_target import open_engine
from embedserve.bench.http_target import HttpSession
from embedserve.bench.images import engine_parts, with_images
from embedserve.bench.runner import build_inputs
from embedserve.bench.target import parse_target
from embedserve.cli import main
from embedserve.errors import InvalidInputError
from tests.helpers.inprocess import server_client
from tests.helpers.reference import cosine
from tests.helpers.tiny_vl import hf_vl_embed

TOKENS_64 = 4 + 2  # a 64 x 64 image: 2 x 2 merged tokens (tiny preprocessor), + vision start / end


def _cfg(model: Path, tmp_path: Path, **kw: object) -> BenchConfig:
    base: dict[str, object] = {
        "targets": [parse_target(f"engine:{model}")],
        "out": tmp_path,
        "lengths": [40, 100],
        "mix": None,
        "concurrency": [1],
        "token_budgets": [64],
        "requests": 3,
        "images_per_input": 2,
        "image_size": (64, 64),
    }
    return BenchConfig(**(base | kw))  # type: ignore[arg-type]


def test_inputs_are_text_plus_images_and_count_image_tokens(qwen3_vl_dir: Path, tmp_path: Path) -> None:
    cfg = _cfg(qwen3_vl_dir, tmp_path)
    mix = cfg.image_mix()
    assert mix is not None and mix.tokens_each == TOKENS_64 and mix.tokens == 2 * TOKENS_64
    inputs = build_inputs(cfg)
    texts = [str(p[0]["text"]) for p in inputs["40"].texts if isinstance(p, list)]
    assert with_images(texts, mix, "40", cfg.seed) == inputs["40"].texts  # deterministic
    tok = Tokenizer.from_file(str(qwen3_vl_dir / "tokenizer.json"))
    for key, n in (("40", 40), ("100", 100)):
        w = inputs[key]
        assert w.tokens == [n] * 3  # the total, image tokens included
        for item in w.texts:
            assert isinstance(item, list) and [p["type"] for p in item] == ["text", "image_url", "image_url"]
            assert len(tok.encode(item[0]["text"]).ids) == n - 2 * TOKENS_64
            images = [p for p in engine_parts(item) if isinstance(p, bytes)]
            assert [Image.open(io.BytesIO(b)).size for b in images] == [(64, 64)] * 2
    urls = [p["image_url"]["url"] for item in inputs["40"].texts for p in item[1:]]  # type: ignore[index]
    assert len(set(urls)) == len(urls)  # every request its own images
    assert isinstance(inputs["warmup"].texts[0], str)


def test_image_mix_refusals(qwen3_vl_dir: Path, qwen3_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match=rf"model {qwen3_dir} .* takes text only"):
        _cfg(qwen3_dir, tmp_path)
    st = [parse_target(f"sentence-transformers:{qwen3_dir}?name=st")]
    with pytest.raises(InvalidInputError, match=r"target st .* takes text only"):
        _cfg(qwen3_vl_dir, tmp_path, targets=st)
    with pytest.raises(InvalidInputError, match="no room for text beside 2 x 64x64"):
        build_inputs(_cfg(qwen3_vl_dir, tmp_path, lengths=[12]))
    with pytest.raises(InvalidInputError, match="matrix scenario only"):
        _cfg(qwen3_vl_dir, tmp_path, scenario="interference")
    assert main(["bench", "--target", f"engine:{qwen3_vl_dir}", "--lengths", "64", "--image-size", "64",
                 "--out", str(tmp_path)]) == 2  # fmt: skip


@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
def test_engine_and_http_targets_send_the_images(qwen3_vl_dir: Path, tmp_path: Path) -> None:
    item = build_inputs(_cfg(qwen3_vl_dir, tmp_path, lengths=[40], requests=1))["40"].texts[0]
    parts = [
        p if isinstance(p, str) else Image.open(io.BytesIO(p)).convert("RGB") for p in engine_parts(item)
    ]
    ref = hf_vl_embed(qwen3_vl_dir, parts)[None]
    session = open_engine(parse_target(f"engine:{qwen3_vl_dir}"), 64)
    try:
        got = asyncio.run(session.embed(item, "online")).vector
    finally:
        asyncio.run(session.aclose())
    assert cosine(got[None], ref)[0] >= 0.99999
    with server_client(qwen3_vl_dir) as c:
        http = HttpSession(parse_target("http://testserver/v1?model=m"))

        async def send() -> np.ndarray:
            http._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=c.app))
            try:
                return (await http.embed(item, "online")).vector
            finally:
                await http.aclose()

        model = c.get("/v1/models").json()["data"][0]["id"]
        http._model = str(model)
        assert cosine(asyncio.run(send())[None], ref)[0] >= 0.99999


@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
def test_small_image_mix_bench_run(qwen3_vl_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    code = main([
        "bench", "--target", f"engine:{qwen3_vl_dir}?name=vl", "--lengths", "48", "--concurrency", "2",
        "--token-budget", "64", "--requests", "3", "--images-per-input", "1", "--image-size", "64x64",
        "--out", str(out), "--no-progress",
    ])  # fmt: skip
    assert code == 0
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1
    r = rows[0]
    assert (r["length"], r["length_bucket"], r["errors"], r["requests"]) == ("48", "0-1K", "0", "3"), r
    assert float(r["tok_per_s"]) > 0 and float(r["cosine_min"]) > 0.9999
    print(f"image-mix bench: {r['req_per_s']} req/s, {r['tok_per_s']} tok/s, p50 {r['p50_ms']} ms")
