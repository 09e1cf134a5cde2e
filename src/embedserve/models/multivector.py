"""Multi-vector (late-interaction) models' heads: the per-token projection, scored by MaxSim.

Which positions give vectors, each side's prompt, length and query expansion are the model's
token rules (models/multivector_rules.py, torch-free: the gateway counts with them);
`MultiVectorHead` adds the projection's weights. pooling/multivector.py writes a request's
projected rows as its chunks finish.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer

from embedserve.errors import ModelLoadError
from embedserve.models.dense_files import dense_state
from embedserve.models.multivector_rules import (
    BGE_M3_FILE,
    TokenVectors,
    check_dense,
    check_dense_weight,
    dense_folder,
    is_bge_m3,
    read_token_vectors,
)


@dataclass(frozen=True, kw_only=True)
class MultiVectorHead(TokenVectors):
    weight: torch.Tensor  # [dim, hidden] float32
    bias: torch.Tensor | None  # [dim]

    @property
    def dim(self) -> int:
        return int(self.weight.shape[0])

    @torch.inference_mode()
    def project(self, rows: torch.Tensor) -> torch.Tensor:
        """[k, hidden] -> [k, dim] float32 (the Dense projection, no normalization)."""
        out = rows.float() @ self.weight.T
        return out if self.bias is None else out + self.bias


def load_multivector_head(root: Path, hidden: int, tokenizer: HFTokenizer) -> MultiVectorHead:
    if is_bge_m3(root):
        weight, bias = _bge_m3(root / BGE_M3_FILE, hidden)
    else:
        weight, bias = _dense(dense_folder(root), hidden)
    rules = read_token_vectors(root, tokenizer)
    fields = {f.name: getattr(rules, f.name) for f in dataclasses.fields(TokenVectors)}
    return MultiVectorHead(weight=weight, bias=bias, **fields)


def _bge_m3(path: Path, hidden: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a bad file
        raise ModelLoadError(f"cannot read {path}: {e}") from e
    weight, bias = state.get("weight"), state.get("bias")
    if weight is None or weight.dim() != 2 or weight.shape[1] != hidden:
        shapes = {k: tuple(v.shape) for k, v in state.items()}
        raise ModelLoadError(f"{path}: expected a Linear({hidden}, dim) state dict, got {shapes}")
    return weight.detach().float(), None if bias is None else bias.detach().float()


def _dense(folder: Path, hidden: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    cfg = check_dense(folder, hidden)
    state = dense_state(folder)
    weight = state.get("linear.weight")
    check_dense_weight(folder, cfg, hidden, None if weight is None else tuple(weight.shape))
    assert weight is not None
    bias = state.get("linear.bias")
    return weight.float(), None if bias is None else bias.float()
