"""The weights of a sentence-transformers `Dense` module, from its folder or from a GGUF file:
read by the sentence-level head (pooling/dense.py) and the multi-vector token head
(models/multivector.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from embedserve.errors import ModelLoadError


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
