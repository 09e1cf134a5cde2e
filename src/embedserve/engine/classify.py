"""Sequence classification on the engine: each text (or text pair, tokenizer/render.py's
`classify`) runs as an ordinary request (same batching, token budget and priorities as an
embedding); its pooled CLS row goes through the model's classifier head (models/score_head.py):
softmax over the labels, or sigmoid per label (`classified`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from embedserve.engine.core import Finished
from embedserve.engine.outputs import EmbeddingOutput, output_of, timings
from embedserve.models.score_head import ScoreHead
from embedserve.tokenizer import Tokenized


@dataclass(frozen=True)
class ClassifyResult:
    label: str  # id2label of the highest probability (the first on ties)
    probs: list[float]  # one per label, in id order (raw_scores: the logits)
    num_classes: int
    num_tokens: int  # of the input as the model read it
    truncated: bool
    queue_time: float  # seconds from submission to first scheduled step
    inference_time: float  # seconds from first scheduled step to finish
    num_preemptions: int = 0
    output: EmbeddingOutput | None = field(default=None, repr=False, compare=False)  # the pooled row


def classified(
    head: ScoreHead, done: list[Finished], tokenized: list[Tokenized], raw_scores: bool
) -> list[ClassifyResult]:
    """The head on the finished requests' pooled rows -> one result each."""
    rows = torch.stack([f.vector for f in done if f.vector is not None])  # [n, hidden]
    out = []
    for (label, p), fin, tok in zip(labelled(head, rows, raw_scores), done, tokenized, strict=True):
        queue_time, inference_time = timings(fin)
        out.append(
            ClassifyResult(
                label,
                p,
                len(p),
                len(tok.token_ids),
                tok.truncated,
                queue_time,
                inference_time,
                fin.request.num_preemptions,
                output_of(fin, tok),
            )
        )
    return out


def labelled(head: ScoreHead, rows: torch.Tensor, raw_scores: bool = False) -> list[tuple[str, list[float]]]:
    """(best label, probabilities) of each pooled row [n, hidden]; the best is the first of
    equal values, as argmax."""
    probs: list[list[float]] = head.probs(rows, raw_scores).tolist()  # [n, labels]
    return [(head.labels[max(range(len(p)), key=p.__getitem__)], p) for p in probs]
