"""BGE-M3's lexical weights (`sparse_linear.pt` beside the checkpoint), as FlagEmbedding's
BGEM3FlagModel computes them:

    weight(token) = relu(sparse_linear(hidden row))              one scalar per token
    vector[id]    = max weight over the tokens of that id        ids with no positive weight: 0

The tokenizer's cls, eos, pad and unk tokens never count (FlagEmbedding's `unused_tokens`,
read from tokenizer_config.json / special_tokens_map.json: `unused_ids`). It folds
by max like SPLADE's head (`weights` / `combine`, pooling/state.py), so it rides chunked
prefill and preemption the same way; it needs each row's token id, which PoolingState hands it.
The same model's dense vector is its usual CLS pooling: one model, two kinds of vector.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer

from embedserve.errors import ModelLoadError


@dataclass(frozen=True)
class LexicalHead:
    weight: torch.Tensor  # [hidden] float32
    bias: float
    vocab_size: int
    excluded: torch.Tensor  # bool [vocab]: ids that never count (special tokens)

    @torch.inference_mode()
    def weights(self, rows: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
        """rows [k, hidden] of tokens `ids` [k] -> the largest weight per id, [vocab] float32."""
        assert ids is not None and ids.shape[0] == rows.shape[0], "lexical weights need each row's token id"
        w = torch.relu(rows.float() @ self.weight + self.bias)
        w = torch.where(self.excluded[ids], torch.zeros_like(w), w)
        out = torch.zeros(self.vocab_size)
        return out.scatter_reduce_(0, ids, w, reduce="amax", include_self=True)

    @staticmethod
    def combine(acc: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        return torch.maximum(acc, part)


def load_lexical_head(path: Path, hidden: int, vocab_size: int, unused: set[int]) -> LexicalHead:
    """`sparse_linear.pt`: a Linear(hidden, 1)'s state dict."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a bad file
        raise ModelLoadError(f"cannot read {path}: {e}") from e
    weight, bias = state.get("weight"), state.get("bias")
    if weight is None or tuple(weight.shape) != (1, hidden) or bias is None or bias.numel() != 1:
        raise ModelLoadError(
            f"{path}: expected a Linear({hidden}, 1) state dict (weight [1, {hidden}], bias [1]), got "
            f"{ {k: tuple(v.shape) for k, v in state.items()} }"
        )
    excluded = torch.zeros(vocab_size, dtype=torch.bool)
    excluded[sorted(i for i in unused if 0 <= i < vocab_size)] = True
    return LexicalHead(weight[0].detach().float(), float(bias.reshape(())), vocab_size, excluded)


def unused_ids(root: Path, tokenizer: HFTokenizer) -> set[int]:
    """The ids of the tokenizer's cls, eos, pad and unk tokens, as transformers names them (a
    BERT vocabulary has no eos: its [SEP] counts, as in FlagEmbedding)."""
    names: dict[str, object] = {}
    for file in ("special_tokens_map.json", "tokenizer_config.json"):
        path = root / file
        if path.exists():
            names.update(json.loads(path.read_text(encoding="utf-8")))
    out = set()
    for key in ("cls_token", "eos_token", "pad_token", "unk_token"):
        value = names.get(key)
        token = value.get("content") if isinstance(value, dict) else value
        found = tokenizer.token_to_id(token) if isinstance(token, str) else None
        if found is not None:
            out.add(found)
    return out
