"""SPLADE's head: each token's row through the masked-LM head to vocabulary logits, then
log(1 + relu(logit)) (twice for `log1p_relu`), folded over the tokens by max (or sum) into one
vocabulary-sized weight vector (sentence-transformers' MLMTransformer + SpladePooling):

    BERT     cls.predictions.transform (dense, gelu, LayerNorm) -> decoder (tied: word embeddings)
             + cls.predictions.bias
    RoBERTa  lm_head.dense -> gelu -> lm_head.layer_norm -> lm_head.decoder (tied) + lm_head.bias

Rows are reduced `ROWS_PER_SLICE` at a time, so a long input never holds its whole [tokens,
vocabulary] logits: at most [ROWS_PER_SLICE, vocabulary] float32 (31 MB for BERT's 30,522).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from embedserve.config import ModelConfig
from embedserve.errors import ModelLoadError

ROWS_PER_SLICE = 256
ACTIVATIONS = ("relu", "log1p_relu")
STRATEGIES = ("max", "sum")

# Checkpoint names of the head's parts, BERT's then RoBERTa's.
_NAMES = {
    "dense.weight": ("cls.predictions.transform.dense.weight", "lm_head.dense.weight"),
    "dense.bias": ("cls.predictions.transform.dense.bias", "lm_head.dense.bias"),
    "norm.weight": ("cls.predictions.transform.LayerNorm.weight", "lm_head.layer_norm.weight"),
    "norm.bias": ("cls.predictions.transform.LayerNorm.bias", "lm_head.layer_norm.bias"),
    "decoder.weight": ("cls.predictions.decoder.weight", "lm_head.decoder.weight"),
    "bias": ("cls.predictions.bias", "lm_head.bias", "cls.predictions.decoder.bias", "lm_head.decoder.bias"),
    "embeddings": ("embeddings.word_embeddings.weight",),
}


@dataclass(frozen=True)
class SparseHead:
    dense_weight: torch.Tensor  # [hidden, hidden] fp32
    dense_bias: torch.Tensor
    norm_weight: torch.Tensor
    norm_bias: torch.Tensor
    decoder: torch.Tensor  # [vocab, hidden]
    bias: torch.Tensor  # [vocab]
    eps: float  # the transform's LayerNorm's (encoders' activation is erf GELU: models/registry.py)
    activation: str = "relu"  # SpladePooling's: relu or log1p_relu
    strategy: str = "max"  # SpladePooling's: max or sum

    @property
    def vocab_size(self) -> int:
        return int(self.decoder.shape[0])

    @torch.inference_mode()
    def weights(self, rows: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """rows [k, hidden] -> the fold of their term weights, [vocab] float32 (max or sum);
        `ids` (the rows' token ids) are not needed here."""
        out: torch.Tensor | None = None
        for lo in range(0, rows.shape[0], ROWS_PER_SLICE):
            w = self._term_weights(rows[lo : lo + ROWS_PER_SLICE].float())
            part = w.amax(dim=0) if self.strategy == "max" else w.sum(dim=0)
            out = part if out is None else self.combine(out, part)
        return torch.zeros(self.vocab_size) if out is None else out

    def combine(self, acc: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        return torch.maximum(acc, part) if self.strategy == "max" else acc + part

    def _term_weights(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(F.linear(x, self.dense_weight, self.dense_bias))
        h = F.layer_norm(h, (h.shape[-1],), self.norm_weight, self.norm_bias, self.eps)
        w = torch.log1p(torch.relu(F.linear(h, self.decoder, self.bias)))
        return torch.log1p(w) if self.activation == "log1p_relu" else w


def load_sparse_head(
    weights: Iterable[tuple[str, torch.Tensor]], model: ModelConfig, activation: str, strategy: str
) -> SparseHead:
    """The masked-LM head's tensors from the checkpoint (the encoder skipped them); the decoder is
    the word embeddings where the checkpoint ties them."""
    if activation not in ACTIVATIONS or strategy not in STRATEGIES:
        raise ModelLoadError(
            f"SpladePooling: activation {activation!r} / pooling {strategy!r}; supported: "
            f"{ACTIVATIONS} / {STRATEGIES}"
        )
    wanted = {name: part for part, names in _NAMES.items() for name in names}
    found: dict[str, torch.Tensor] = {}
    for name, t in weights:
        key = name.removeprefix("bert.").removeprefix("roberta.")
        part = wanted.get(key)
        if part is not None and part not in found:
            found[part] = t.detach().float()
    found.setdefault("decoder.weight", found.get("embeddings", torch.empty(0)))
    missing = [p for p in _NAMES if p != "embeddings" and p not in found]
    if missing or found["decoder.weight"].numel() == 0:
        raise ModelLoadError(
            f"no masked-LM head in the checkpoint (missing {missing or ['decoder.weight']}): a SPLADE "
            "model is a *ForMaskedLM"
        )
    return SparseHead(
        found["dense.weight"],
        found["dense.bias"],
        found["norm.weight"],
        found["norm.bias"],
        found["decoder.weight"],
        found["bias"],
        model.layer_norm_eps,
        activation,
        strategy,
    )
