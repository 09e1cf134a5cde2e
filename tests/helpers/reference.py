"""Independent references: Hugging Face transformers / sentence-transformers in float32."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch


@lru_cache(maxsize=8)
def st_model(path: str):  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device="cpu")


def st_embed(path: Path, texts: list[str], prompt_name: str | None = None, batch_size: int = 8) -> np.ndarray:
    """sentence-transformers itself: tokenization, prompts, pooling and Normalize from the files."""
    model = st_model(str(path))
    return np.asarray(
        model.encode(texts, prompt_name=prompt_name, batch_size=batch_size, convert_to_numpy=True)
    )


@lru_cache(maxsize=8)
def hf_model(path: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def hf_embed_ids(
    path: Path, seqs: list[list[int]], pooling: str = "lasttoken", normalize: bool = True
) -> np.ndarray:
    """transformers forward on each sequence alone (no padding), pooled the ST way."""
    model = hf_model(str(path))
    out = []
    with torch.inference_mode():
        for ids in seqs:
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0].float()
            if pooling == "lasttoken":
                v = hidden[-1]
            elif pooling == "mean":
                v = hidden.mean(0)
            else:
                v = hidden[0]
            if normalize:
                v = torch.nn.functional.normalize(v, dim=-1)
            out.append(v.numpy())
    return np.stack(out)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two [n, d] arrays."""
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return np.sum(a * b, axis=-1)


def random_ids(n: int, seed: int, vocab: int = 151643) -> list[int]:
    """Random ordinary-token ids (below the special-token range) of length n."""
    gen = np.random.default_rng(seed)
    return [int(x) for x in gen.integers(0, vocab, size=n)]
