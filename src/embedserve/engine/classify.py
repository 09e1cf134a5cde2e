"""Sequence classification on the engine: each text (or text pair) runs as an ordinary request
(same batching, token budget and priorities as an embedding); its pooled CLS row goes through
the model's classifier head (models/score_head.py): softmax over the labels, or sigmoid per label.

`ClassifyMixin` gives `Engine` its classify methods (engine.py keeps the embedding API).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from embedserve.engine.base import EngineBase
from embedserve.engine.core import Finished
from embedserve.engine.loop import gather_all, wait_all
from embedserve.engine.outputs import timings
from embedserve.errors import InputTooLongError, InvalidInputError
from embedserve.models.registry import CLASSIFIER
from embedserve.models.score_head import ScoreHead
from embedserve.pairs import encode_cross_pair
from embedserve.tokenizer import Tokenized, Truncate

# A string, or a list of: strings, (text, text_pair) pairs, token-id lists (specials included).
ClassifyInputs = str | Sequence[str | tuple[str, str] | Sequence[int]]


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


class ClassifyMixin(EngineBase):
    def classifier(self) -> ScoreHead:
        """The model's classifier head; InvalidInputError for a model that cannot classify."""
        head = self.score_head
        if head is None or head.kind != CLASSIFIER:
            what = "an embedding model" if head is None else "a yes / no reranker"
            raise InvalidInputError(f"this model is {what}: it cannot classify")
        return head

    def tokenize_classify(self, inputs: ClassifyInputs, truncate: str = "error") -> list[Tokenized]:
        """Each input as the classifier reads it; all or nothing (InvalidInputError naming the
        first bad one). `inputs`: a string, or a list of strings, (text, text_pair) pairs (the
        tokenizer's pair template, as a cross-encoder reads one; only the second text is cut) and
        token-id lists. `truncate`: "error" (default: an input over max_model_len is refused),
        "end" or "start" (cut that end of the text, keeping the special tokens)."""
        self.classifier()
        policy = Truncate.parse(truncate)
        items: Sequence[Any] = [inputs] if isinstance(inputs, str) else inputs
        if len(items) == 0:
            raise InvalidInputError("inputs is empty: pass at least one string, text pair or token list")
        out = []
        for i, item in enumerate(items):
            try:
                out.append(self._encode(item, policy))
            except InputTooLongError as e:
                raise InputTooLongError(e.num_tokens, e.limit, index=i) from None
            except InvalidInputError as e:
                raise InvalidInputError(f"input {i}: {e}") from None
        return out

    def _encode(self, item: object, policy: Truncate) -> Tokenized:
        limit = self.config.scheduler.max_model_len
        if isinstance(item, str):
            return self.tokenizer.encode(item, limit, policy)
        if isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(x, str) for x in item):
            types = self.config.model.type_vocab_size > 1
            return encode_cross_pair(self.tokenizer, item[0], item[1], limit, policy, types)
        if isinstance(item, (list, tuple)):
            return self.tokenizer.check_ids(list(item), limit, policy)
        raise InvalidInputError(
            f"expected a string, a (text, text_pair) pair or a list of token ids, got {type(item).__name__}"
        )

    async def classify_tokenized_async(
        self, tokenized: list[Tokenized], *, raw_scores: bool = False, priority: str = "online"
    ) -> list[ClassifyResult]:
        """Run inputs that `tokenize_classify` produced; one result each, in order."""
        head = self.classifier()
        done = await gather_all(self.submit_tokenized(tokenized, normalize=False, priority=priority))
        return classified(head, done, tokenized, raw_scores)

    def classify(
        self,
        inputs: ClassifyInputs,
        *,
        truncate: str = "error",
        raw_scores: bool = False,
        priority: str = "online",
    ) -> list[ClassifyResult]:
        """Classify each input (see `tokenize_classify`); one result each, in input order.
        Probabilities as transformers' text-classification pipeline and vLLM's classify: softmax
        over the labels; sigmoid per label for one label or a multi_label_classification model;
        the logits for a regression one. `raw_scores`: the logits. `priority`: "online" / "batch"."""
        tokenized = self.tokenize_classify(inputs, truncate)
        done = wait_all(self.submit_tokenized(tokenized, normalize=False, priority=priority))
        return classified(self.classifier(), done, tokenized, raw_scores)

    async def classify_async(
        self,
        inputs: ClassifyInputs,
        *,
        truncate: str = "error",
        raw_scores: bool = False,
        priority: str = "online",
    ) -> list[ClassifyResult]:
        """`classify`, awaited (cancelling it frees the queued inputs); options as `classify`."""
        tokenized = self.tokenize_classify(inputs, truncate)
        return await self.classify_tokenized_async(tokenized, raw_scores=raw_scores, priority=priority)


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
            )
        )
    return out


def labelled(head: ScoreHead, rows: torch.Tensor, raw_scores: bool = False) -> list[tuple[str, list[float]]]:
    """(best label, probabilities) of each pooled row [n, hidden]; the best is the first of
    equal values, as argmax."""
    probs: list[list[float]] = head.probs(rows, raw_scores).tolist()  # [n, labels]
    return [(head.labels[max(range(len(p)), key=p.__getitem__)], p) for p in probs]
