"""The pooled vector through sentence-transformers `Dense` modules (EmbeddingGemma: 768 -> 3072 ->
768, no bias, identity), in float32, before Matryoshka slicing and normalization (pooling/head.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

from embedserve.config import DenseLayer
from embedserve.errors import ModelLoadError

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


def dense_state(folder: Path) -> dict[str, torch.Tensor]:
    """A sentence-transformers Dense module's tensors (`linear.weight`, `linear.bias`): its
    folder's model.safetensors, else pytorch_model.bin; ModelLoadError naming the folder."""
    try:
        if (folder / "model.safetensors").is_file():
            return load_file(str(folder / "model.safetensors"))
        if (folder / "pytorch_model.bin").is_file():
            return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors and torch raise several types for a damaged file
        raise ModelLoadError(f"cannot read the Dense weights in {folder}: {e}") from e
    raise ModelLoadError(f"{folder}: no model.safetensors or pytorch_model.bin (the Dense module's weights)")


def gguf_state(file: Path, tensor: str) -> dict[str, torch.Tensor]:
    """One Dense weight stored in a GGUF file (llama.cpp's `dense_2.weight`), dequantized."""
    import numpy as np
    from gguf import GGUFReader, quants

    try:
        found = next((t for t in GGUFReader(file, "r").tensors if t.name == tensor), None)
        if found is None:
            raise ModelLoadError(f"{file} has no {tensor} tensor")
        values = np.array(quants.dequantize(found.data, found.tensor_type), dtype=np.float32)
    except ModelLoadError:
        raise
    except Exception as e:  # gguf raises assorted types for damaged files and unknown types
        raise ModelLoadError(f"cannot read the Dense weight {tensor} in {file}: {e}") from e
    return {"linear.weight": torch.from_numpy(values)}


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
