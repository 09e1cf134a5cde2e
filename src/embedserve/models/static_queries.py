"""Inference-free SPLADE's query weights (models/router.py reads the directory and tokenizes):
a query's vector is the weight of each vocabulary id its tokens hold, once each, as
sentence-transformers' SparseStaticEmbedding computes it: no forward pass."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from embedserve.errors import ModelLoadError
from embedserve.models.router import StaticQueryTokens


class StaticQueries(StaticQueryTokens):
    """Inference-free queries: token ids -> their vocabulary weights, without the model."""

    def __init__(self, folder: Path, vocab_size: int) -> None:
        weights = load_file(str(folder / "model.safetensors"))
        weight = weights.get("weight")
        if weight is None or weight.dim() != 1 or weight.shape[0] != vocab_size:
            raise ModelLoadError(
                f"{folder}: expected a `weight` of {vocab_size} values (one per vocabulary id), got "
                f"{None if weight is None else tuple(weight.shape)}"
            )
        self.weight = weight.detach().float().numpy()
        super().__init__(folder)

    def vector(self, ids: list[int]) -> torch.Tensor:
        out = np.zeros_like(self.weight)
        present = np.unique(np.asarray(ids, dtype=np.int64))
        out[present] = self.weight[present]
        return torch.from_numpy(out)
