"""The pooled vector through sentence-transformers `Dense` modules (EmbeddingGemma: 768 -> 3072 ->
768, no bias, identity), in float32, before Matryoshka slicing and normalization (pooling/head.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from embedserve.config import DenseLayer
from embedserve.errors import ModelLoadError
from embedserve.models.dense_files import dense_state, gguf_state

_ACT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda x: x,
    "tanh": torch.tanh,
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "sigmoid": torch.sigmoid,
}


class DenseHead:
    """The Dense chain's float32 weights; `__call__` maps [in] (or [n, in], row by row) to [out]."""

    def __init__(self, layers: tuple[DenseLayer, ...]) -> None:
        self.layers = [(*_weights(layer), _ACT[layer.activation]) for layer in layers]

    @torch.inference_mode()
    def __call__(self, vector: torch.Tensor) -> torch.Tensor:
        if vector.dim() == 2:  # each row alone: the bits of the same row pooled alone
            return torch.stack([self(row) for row in vector])
        x = vector.float()
        for weight, bias, act in self.layers:
            x = torch.nn.functional.linear(x, weight, bias)
            x = act(x)
        return x


def _weights(layer: DenseLayer) -> tuple[torch.Tensor, torch.Tensor | None]:
    folder = Path(layer.path)
    state = gguf_state(folder, layer.tensor) if layer.tensor else dense_state(folder)
    weight, bias = state.get("linear.weight"), state.get("linear.bias")
    if weight is None or tuple(weight.shape) != (layer.out_features, layer.in_features):
        got = None if weight is None else tuple(weight.shape)
        raise ModelLoadError(
            f"{folder}: linear.weight is {got}, expected [{layer.out_features}, {layer.in_features}]"
        )
    if layer.bias and (bias is None or tuple(bias.shape) != (layer.out_features,)):
        raise ModelLoadError(f"{folder}: the Dense module has a bias but linear.bias is missing or misshapen")
    return weight.float().contiguous(), bias.float() if layer.bias and bias is not None else None
