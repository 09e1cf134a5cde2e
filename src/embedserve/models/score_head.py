"""Score heads of rerankers and classifiers, applied from outside the model to one pooled row per
input (a text, or a (query, document) pair).

The encoder / decoder stay pure architectures (their task heads are skipped when loading);
the engine pools the input's row (CLS for a *ForSequenceClassification, the last token for
Qwen3-Reranker, both unnormalized) and this head turns it into logits, then a score or probabilities:

    classifier      BERT:     tanh(pooler.dense(cls)) -> classifier          -> [labels] logits
                    RoBERTa / XLM-R: tanh(classifier.dense(cls)) -> out_proj -> [labels] logits
                    rerank (one label): score = sigmoid(logit) (CrossEncoder.predict's default), or
                    the raw logit
                    classify: probs = softmax over the labels; sigmoid per label for one label or
                    problem_type "multi_label_classification"; the logits for "regression"
                    (transformers' text-classification pipeline, vLLM's classify)
    yes / no        last hidden (final-normed) @ lm_head[[yes, no]].T        -> 2 logits
                    score = softmax(yes, no)[yes]; raw: the log-odds yes - no
                    (only these two rows of the LM head are kept and computed)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from embedserve.config import ModelConfig
from embedserve.errors import ModelLoadError
from embedserve.models.registry import CLASSIFIER, YES_NO


@dataclass(frozen=True)
class ScoreHead:
    kind: str
    out_weight: torch.Tensor  # [labels, hidden] fp32 (yes / no: [2, hidden])
    out_bias: torch.Tensor | None = None  # [labels]
    dense_weight: torch.Tensor | None = None  # [hidden, hidden]: the tanh layer before `out`
    dense_bias: torch.Tensor | None = None
    labels: tuple[str, ...] = ()  # a classifier's label names by id (ModelConfig.labels)
    problem_type: str | None = None  # a classifier's, from config.json

    @property
    def num_labels(self) -> int:
        return int(self.out_weight.shape[0])

    @torch.inference_mode()
    def logits(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled: [n, hidden] -> [n, labels] float32 logits (yes / no: [n, 2])."""
        x = pooled.float()
        if self.dense_weight is not None:
            x = torch.tanh(torch.nn.functional.linear(x, self.dense_weight, self.dense_bias))
        return torch.nn.functional.linear(x, self.out_weight, self.out_bias)

    @torch.inference_mode()
    def scores(self, pooled: torch.Tensor, raw: bool = False) -> torch.Tensor:
        """A reranker's: pooled [n, hidden] -> [n] float32 scores (a classifier of one label)."""
        logits = self.logits(pooled)  # [n, labels]
        if self.kind == YES_NO:
            return logits[:, 0] - logits[:, 1] if raw else torch.softmax(logits, dim=-1)[:, 0]
        return logits[:, 0] if raw else torch.sigmoid(logits[:, 0])

    @torch.inference_mode()
    def probs(self, pooled: torch.Tensor, raw: bool = False) -> torch.Tensor:
        """A classifier's: pooled [n, hidden] -> [n, labels] float32 probabilities (`raw`: logits)."""
        logits = self.logits(pooled)
        if raw or self.problem_type == "regression":
            return logits
        if self.problem_type == "multi_label_classification" or self.num_labels == 1:
            return torch.sigmoid(logits)
        return torch.softmax(logits, dim=-1)


def load_score_head(
    kind: str,
    weights: Iterable[tuple[str, torch.Tensor]],
    yes_no_ids: tuple[int, int] | None = None,
    model: ModelConfig | None = None,
) -> ScoreHead:
    """Read the head's tensors from the checkpoint (the model skipped them); a classifier's
    labels and problem_type from `model` (labels "LABEL_i" where it names none)."""
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
    rows = found[f"{out}.weight"].shape[0]
    labels = model.labels if model is not None and model.labels else tuple(f"LABEL_{i}" for i in range(rows))
    if len(labels) != rows:
        raise ModelLoadError(f"config.json names {len(labels)} labels but the classifier has {rows} outputs")
    return ScoreHead(
        CLASSIFIER,
        found[f"{out}.weight"],
        found.get(f"{out}.bias"),
        found[f"{dense}.weight"],
        found.get(f"{dense}.bias"),
        labels,
        model.problem_type if model is not None else None,
    )


def _yes_no_head(weights: Iterable[tuple[str, torch.Tensor]], ids: tuple[int, int]) -> ScoreHead:
    rows: dict[str, torch.Tensor] = {}
    for name, t in weights:
        if name in ("lm_head.weight", "model.embed_tokens.weight", "embed_tokens.weight"):
            rows[name.rsplit(".", 2)[-2]] = t[list(ids)].detach().float()  # [2, hidden] only
    table = rows.get("lm_head", rows.get("embed_tokens"))  # tied: the embedding table
    if table is None:
        raise ModelLoadError("no lm_head.weight (or tied embed_tokens.weight) for the yes / no rows")
    return ScoreHead(YES_NO, table)
