"""Mean pooling that excludes the prompt (`include_prompt: false`) vs sentence-transformers."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from tests.helpers.engine_calls import embed_tokenized_async
from tests.helpers.reference import cosine, st_embed


@pytest.mark.parametrize("layer_major_tokens", [0, 1])  # chunked, then through the lane
def test_mean_pooling_without_prompt_matches_sentence_transformers(
    qwen2_dir: Path, tmp_path: Path, layer_major_tokens: int
) -> None:
    d = shutil.copytree(qwen2_dir, tmp_path / "no-prompt")
    cfg_file = d / "1_Pooling" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["include_prompt"] = False
    cfg_file.write_text(json.dumps(cfg))
    queries = ["what is rope?", "how are long documents embedded in chunks"]
    ref = st_embed(d, queries, prompt_name="query")
    with_prompt = st_embed(qwen2_dir, queries, prompt_name="query")
    with Engine.from_pretrained(d, max_num_batched_tokens=8, layer_major_tokens=layer_major_tokens) as engine:
        got = engine.embed(queries, prompt_name="query")
        # The pre-tokenized path (what the server uses) keeps the prompt length too.
        tokenized = engine.renderer.text(queries, engine.renderer.prompt("query", None))
        outs = asyncio.run(embed_tokenized_async(engine, tokenized))
    assert cosine(got, ref).min() >= 0.99999
    np.testing.assert_allclose(np.stack([o.embedding for o in outs]), got, rtol=1e-6, atol=1e-7)
    assert cosine(got, with_prompt).max() < 0.9999  # the prompt really was left out
