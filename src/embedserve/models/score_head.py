"""Reranker heads, applied from outside the model to one pooled row per (query, document) pair.

The encoder / decoder stay pure architectures (their task heads are skipped when loading);
the engine pools the pair's row (CLS for a cross-encoder, the last token for Qwen3-Reranker,
both unnormalized) and this head turns it into a score:

    cross-encoder   BERT:     tanh(pooler.dense(cls)) -> classifier          -> 1 logit
                    RoBERTa / XLM-R: tanh(classifier.dense(cls)) -> out_proj -> 1 logit
                    score = sigmoid(logit) (CrossEncoder.predict's default), or the raw logit
    yes / no        last hidden (final-normed) @ lm_head[[yes, no]].T        -> 2 logits
                    score = softmax(yes, no)[yes]; raw: the log-odds yes - no
                    (only these two rows of the LM head are kept and computed)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from embedserve.config import ModelConfig
from embedserve.errors import ModelLoadError

CLASSIFIER = "classifier"
YES_NO = "yes_no"


def rerank_kind(model: ModelConfig, path: Path) -> str | None:
    """A *ForSequenceClassification encoder is a cross-encoder; a causal LM whose directory is
    named like Qwen3-Reranker ("reranker" in its name) is a yes / no reranker; else None."""
    if model.architecture.endswith("ForSequenceClassification"):
        return CLASSIFIER
    if model.is_causal and "reranker" in path.name.lower():
        return YES_NO
    return None


@dataclass(frozen=True)
class ScoreHead:
    kind: str
    out_weight: torch.Tensor  # [labels, hidden] fp32 (yes / no: [2, hidden])
    out_bias: torch.Tensor | None = None  # [labels]
    dense_weight: torch.Tensor | None = None  # [hidden, hidden]: the tanh layer before `out`
    dense_bias: torch.Tensor | None = None

    @torch.inference_mode()
    def scores(self, pooled: torch.Tensor, raw: bool = False) -> torch.Tensor:
        """pooled: [n, hidden] -> [n] float32 scores."""
        x = pooled.float()
        if self.dense_weight is not None:
            x = torch.tanh(torch.nn.functional.linear(x, self.dense_weight, self.dense_bias))
        logits = torch.nn.functional.linear(x, self.out_weight, self.out_bias)  # [n, labels]
        if self.kind == YES_NO:
            return logits[:, 0] - logits[:, 1] if raw else torch.softmax(logits, dim=-1)[:, 0]
        return logits[:, 0] if raw else torch.sigmoid(logits[:, 0])


def load_score_head(
    kind: str, weights: Iterable[tuple[str, torch.Tensor]], yes_no_ids: tuple[int, int] | None = None
) -> ScoreHead:
    """Read the head's tensors from the checkpoint (the model skipped them)."""
    if kind == YES_NO:
        assert yes_no_ids is not None
        return _yes_no_head(weights, yes_no_ids)
    found: dict[str, torch.Tensor] = {}
    for name, t in weights:
        key = name.removeprefix("bert.").removeprefix("roberta.")
        if key.startswith(("pooler.dense.", "classifier.")):
            found[key] = t.detach().float()
    dense = "pooler.dense" if "pooler.dense.weight" in found else "classifier.dense"
    out = "classifier.out_proj" if "classifier.out_proj.weight" in found else "classifier"
    if f"{out}.weight" not in found or f"{dense}.weight" not in found:
        raise ModelLoadError(f"no classifier head in the checkpoint (found: {sorted(found) or 'nothing'})")
    head = ScoreHead(
        CLASSIFIER,
        found[f"{out}.weight"],
        found.get(f"{out}.bias"),
        found[f"{dense}.weight"],
        found.get(f"{dense}.bias"),
    )
    labels = head.out_weight.shape[0]
    if labels != 1:
        raise ModelLoadError(f"a reranker needs one output label; this classifier has {labels}")
    return head


def _yes_no_head(weights: Iterable[tuple[str, torch.Tensor]], ids: tuple[int, int]) -> ScoreHead:
    rows: dict[str, torch.Tensor] = {}
    for name, t in weights:
        if name in ("lm_head.weight", "model.embed_tokens.weight", "embed_tokens.weight"):
            rows[name.rsplit(".", 2)[-2]] = t[list(ids)].detach().float()  # [2, hidden] only
    table = rows.get("lm_head", rows.get("embed_tokens"))  # tied: the embedding table
    if table is None:
        raise ModelLoadError("no lm_head.weight (or tied embed_tokens.weight) for the yes / no rows")
    return ScoreHead(YES_NO, table)
