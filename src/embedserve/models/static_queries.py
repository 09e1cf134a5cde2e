"""Inference-free SPLADE's query weights (models/router.py reads the directory and tokenizes):
a query's vector is the weight of each vocabulary id its tokens hold, once each, as
sentence-transformers' SparseStaticEmbedding computes it: no forward pass."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from embedserve.models.router import StaticQueryTokens, check_static_weight


class StaticQueries(StaticQueryTokens):
    """Inference-free queries: token ids -> their vocabulary weights, without the model."""

    def __init__(self, folder: Path, vocab_size: int) -> None:
        weights = load_file(str(folder / "model.safetensors"))
        weight = weights.get("weight")
        check_static_weight(folder, vocab_size, None if weight is None else tuple(weight.shape))
        assert weight is not None
        self.weight = weight.detach().float().numpy()
        super().__init__(folder)

    def vector(self, ids: list[int]) -> torch.Tensor:
        out = np.zeros_like(self.weight)
        present = np.unique(np.asarray(ids, dtype=np.int64))
        out[present] = self.weight[present]
        return torch.from_numpy(out)
