"""Engine: the public API. Loads a model; every output goes one way: `prepare` renders the inputs
for an `Ask` (engine/ask.py), `submit` queues them, `run` / `run_async` wait and return typed
answers. `embed`, `rerank` and `classify` are that path shaped for their one use."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.engine.adapters import adapter_view
from embedserve.engine.ask import Ask, LateChunking, MultiVectorInput, Prepared, answers_as
from embedserve.engine.builder import build_engine
from embedserve.engine.classify import ClassifyResult, classified
from embedserve.engine.core import Finished
from embedserve.engine.late import LateChunkingMixin, LateChunkOutput
from embedserve.engine.lexical import LexicalMixin, OnePassOutput
from embedserve.engine.loop import gather_all, wait_all
from embedserve.engine.options import EngineOptions
from embedserve.engine.outputs import EmbeddingOutput, output_of, parse_priority
from embedserve.engine.prefix import PromptCacheMixin
from embedserve.engine.rerank import RerankResult, check_top_n, ranked, scored
from embedserve.errors import InvalidInputError
from embedserve.pooling.outputs import Output
from embedserve.tokenizer.render import ClassifyInputs

__all__ = [  # the asks' and answers' types, where callers look
    "Answer", "Ask", "ClassifyResult", "EmbeddingOutput", "Engine", "Inputs", "LateChunkOutput",
    "LateChunking", "MultiVectorInput", "OnePassOutput", "Output", "Prepared", "RerankResult", "answers_as",
    "output_of",
]  # fmt: skip

# A multimodal model's items may also be an image (PIL image or PNG / JPEG / WebP bytes) or a
# list of strings and images (vision/prompt.py). SCORES takes (query, documents); SPANS one
# document (its text, or its chunks' texts); LABELS texts, text pairs and token ids.
Inputs = Sequence[str] | Sequence[Sequence[int]] | str | Sequence[Any]

# One answer per input (SPANS: per document), its type the ask's output's:
#   DENSE, SPARSE, LEXICAL, MULTIVECTOR   EmbeddingOutput (its embedding [dim], [vocab], [vectors, dim])
#   DENSE with extras (BGE-M3)            OnePassOutput
#   SPANS                                 LateChunkOutput
#   SCORES / LABELS                       RerankResult (input order) / ClassifyResult
Answer = EmbeddingOutput | OnePassOutput | LateChunkOutput | RerankResult | ClassifyResult


class Engine(LateChunkingMixin, PromptCacheMixin, LexicalMixin):
    """Every output of the loaded model through one submit path; loading and lifecycle."""

    # ---- construction ----------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls, path: str | Path, options: EngineOptions | None = None, **overrides: Any
    ) -> Engine:
        """Load a model directory with `options` (engine/options.py: dtype, device, token budget,
        ...), any field also given as a keyword. The model is loaded on the engine loop's thread."""
        options = (options or EngineOptions()).replace(**overrides)  # an unknown keyword fails here
        return cls(functools.partial(build_engine, path, options))

    def with_adapter(self, name: str) -> Engine:
        """This engine with its requests run by LoRA adapter `name` (the same loop and queue)."""
        return adapter_view(self, name)

    # ---- the one path: prepare, submit, run ------------------------------------------------

    def prepare(self, inputs: Any, ask: Ask | None = None) -> Prepared:
        """Render and validate every input for `ask` (all or nothing: InvalidInputError naming
        the first bad one). A server counts and admits the prepared tokens before it runs them."""
        ask = ask or Ask()
        render, out = self.renderer, ask.output
        if out is Output.SPARSE and out not in self.outputs:  # a SPLADE model's DENSE ask is sparse
            raise InvalidInputError(
                f"model {self.name} gives dense vectors: it has no sparse output (SPLADE)"
            )
        if out is Output.SCORES:
            query, documents = inputs
            return Prepared(ask, render.pairs(query, documents, ask.truncate, ask.instruction))
        if out is Output.LABELS:
            return Prepared(ask, render.classify(inputs, ask.truncate))
        if out is Output.MULTIVECTOR:
            sides = render.multivector(
                inputs, ask.side, prompt_name=ask.prompt_name, prompt=ask.prompt, truncate=ask.truncate
            )
            return Prepared(ask, [s.tokenized for s in sides], sides=sides)
        text_prompt = render.prompt(ask.prompt_name, ask.prompt)
        if out is Output.SPANS:
            render.check_dimensions(ask.dimensions)  # the windows' rows are sliced after they are joined
            plan = render.late(inputs, ask.late, text_prompt, ask.truncate)
            return Prepared(ask, plan.windows, plan=plan)
        if out is not Output.LEXICAL:
            render.check_dimensions(ask.dimensions)
            parse_priority(ask.priority)
            if render.routes_statically(ask.prompt_name):  # inference-free SPLADE's queries
                return Prepared(ask, render.static(inputs, text_prompt, ask.truncate))
        return Prepared(ask, render.text(inputs, text_prompt, ask.truncate))

    def submit(self, prepared: Prepared) -> list[Future[Finished]]:
        """Queue each prepared sequence as one request; one future per sequence."""
        ask, tokenized = prepared.ask, prepared.tokenized
        out = ask.output
        if out is Output.SPANS:
            assert prepared.plan is not None, "a SPANS ask is prepared with its plan"
            return self._submit_late(prepared.plan, ask)
        if out is Output.MULTIVECTOR:
            assert prepared.sides is not None, "a MULTIVECTOR ask is prepared with its sides"
            return self._submit_multivector(prepared.sides, ask.dimensions, ask.normalize, ask.priority)
        if out is Output.LEXICAL:
            return self._submit_lexical(tokenized, ask.priority, ask.normalize)
        if ask.extras:
            return self._submit_one_pass(tokenized, ask)
        if out in (Output.SCORES, Output.LABELS):  # the head reads the pooled rows as they are
            (self.renderer.check_reranks if out is Output.SCORES else self.renderer.check_classifies)()
            return self._submit_tokenized(tokenized, normalize=False, priority=ask.priority)
        return self._submit_tokenized(
            tokenized, dimensions=ask.dimensions, normalize=ask.normalize, priority=ask.priority
        )

    def run(self, inputs: Any, ask: Ask | None = None) -> list[Answer]:
        """`prepare` (unless `inputs` is Prepared), `submit`, wait: one answer per input."""
        prepared = inputs if isinstance(inputs, Prepared) else self.prepare(inputs, ask)
        return self._answers(prepared, wait_all(self.submit(prepared)))

    async def run_async(self, inputs: Any, ask: Ask | None = None) -> list[Answer]:
        """`run`, awaited (cancelling it frees the queued inputs)."""
        prepared = inputs if isinstance(inputs, Prepared) else self.prepare(inputs, ask)
        return self._answers(prepared, await gather_all(self.submit(prepared)))

    def _answers(self, prepared: Prepared, done: list[Finished]) -> list[Answer]:
        ask, tokenized = prepared.ask, prepared.tokenized
        if ask.output in (Output.SCORES, Output.LABELS):
            head = self.score_head
            assert head is not None, "a SCORES / LABELS ask is prepared on a model with a score head"
            shape = scored if ask.output is Output.SCORES else classified
            return list(shape(head, done, tokenized, ask.raw_scores))
        outputs = [output_of(f, t) for f, t in zip(done, tokenized, strict=True)]
        if ask.output is Output.SPANS:
            assert prepared.plan is not None
            return [self._late_output(prepared.plan, outputs, ask)]
        if ask.extras:
            return list(self._one_pass(outputs, ask))
        return list(outputs)

    # ---- shaped for one use ----------------------------------------------------------------

    def embed(
        self,
        inputs: Inputs,
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
        truncate: str = "error",
    ) -> np.ndarray:
        """Embed strings or token-id lists; returns float32 [len(inputs), dim] in input order.
        Options as `Ask`'s."""
        ask = Ask(Output.DENSE, prompt_name, prompt, dimensions, normalize, priority, truncate)
        return _stack(self.run(inputs, ask))

    async def embed_async(
        self,
        inputs: Inputs,
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
        truncate: str = "error",
    ) -> np.ndarray:
        """`embed`, awaited; options as `Ask`'s."""
        ask = Ask(Output.DENSE, prompt_name, prompt, dimensions, normalize, priority, truncate)
        return _stack(await self.run_async(inputs, ask))

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        raw_scores: bool = False,
        truncate: str = "end",
        instruction: str | None = None,
        priority: str = "online",
    ) -> list[RerankResult]:
        """Score every document against the query; best first, the first `top_n` (all: None).
        Scores: sigmoid of a cross-encoder's logit (CrossEncoder.predict), P(yes) of a yes /
        no reranker; `raw_scores`: the logit (log-odds yes - no)."""
        check_top_n(top_n)
        ask = Ask(Output.SCORES, truncate=truncate, priority=priority)
        ask = replace(ask, raw_scores=raw_scores, instruction=instruction)
        return ranked(answers_as(self.run((query, documents), ask), RerankResult), top_n)

    def classify(
        self,
        inputs: ClassifyInputs,
        *,
        truncate: str = "error",
        raw_scores: bool = False,
        priority: str = "online",
    ) -> list[ClassifyResult]:
        """Classify each input (strings, (text, text_pair) pairs, token-id lists); one result
        each, in input order. Probabilities as transformers' text-classification pipeline and
        vLLM's classify: softmax over the labels; sigmoid per label for one label or a
        multi_label_classification model; the logits for a regression one (`raw_scores`: the logits)."""
        ask = Ask(Output.LABELS, truncate=truncate, priority=priority, raw_scores=raw_scores)
        return answers_as(self.run(inputs, ask), ClassifyResult)

    # ---- introspection and lifecycle -------------------------------------------------------

    def stats(self) -> dict[str, int]:
        return self._loop.stats()

    @property
    def alive(self) -> bool:
        return self._loop.alive

    def close(self) -> None:
        self._loop.stop()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stack(answers: list[Answer]) -> np.ndarray:
    return np.stack([a.embedding for a in answers_as(answers, EmbeddingOutput)])
