"""Token counts at the gateway, exactly as the pools' engines will count them: by construction.

The counter opens the model the pools serve (directory or .gguf file) without its weights or
torch, makes the `RenderSpec` its files give (tokenizer/spec.py: tokenizer, prompt table,
default prompt name, score head kind, multimodal prompter, static queries, token-vector rules)
and counts through the engine's own `Renderer` (tokenizer/render.py), without length limits:
the full length decides the pool (and the over-long policy). Every response's per-input
`num_tokens` is compared with these counts (count mismatches metric).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from embedserve.api.multimodal import ImageURL, image_size
from embedserve.api.routes import wrong_task
from embedserve.errors import InvalidInputError
from embedserve.models.open import open_model
from embedserve.pooling.outputs import Output
from embedserve.tokenizer import Tokenizer
from embedserve.tokenizer.late import LateChunking
from embedserve.tokenizer.render_sides import Renderer
from embedserve.tokenizer.spec import RenderSpec
from embedserve.vision.prompt import ImagePart


class TokenCounter:
    def __init__(self, model_path: str | Path) -> None:
        # A model directory or .gguf file, opened as the engine opens it; weights are not read.
        source = open_model(model_path)
        self.model_path = str(source.path)
        self.spec = RenderSpec.of_files(source)
        self.model_name = source.path.name  # what its refusals call the model (the gateway's name)
        self.labels = source.model.labels  # a classifier's, by id

    @property
    def tokenizer(self) -> Tokenizer:
        return self.spec.tokenizer

    @property
    def prompts(self) -> dict[str, str]:
        return dict(self.spec.prompts)

    @property
    def renderer(self) -> Renderer:
        return Renderer(self.spec, self.model_name)

    def resolve_prompt(self, prompt_name: str | None, prompt: str | None) -> str:
        """The engine's rules, shared with it (`Renderer.prompt`)."""
        return self.renderer.prompt(prompt_name, prompt)

    def count(self, items: Sequence[Any], prompt: str) -> list[int]:
        """Tokens per input (prompt and special tokens included); raises naming the first bad one."""
        return self.renderer.count(self._parts(items), prompt, _size)

    def count_late(self, document: Any, late: LateChunking, prompt: str) -> int:
        """A late-chunked document's tokens, whole (a long one's windows are the pool's to cut); the
        renderer refuses a document that is not text."""
        return len(self.renderer.late(document, late, prompt).document.token_ids)

    def count_multivector(
        self, items: Sequence[Any], side: str, prompt_name: str | None, prompt: str | None
    ) -> list[int]:
        """Positions per input on `side` (its prompt, a query's expansion), as the pools read them."""
        if Output.MULTIVECTOR not in self.spec.outputs:  # the pool refuses it, naming the model
            return self.count(items, self.resolve_prompt(prompt_name, prompt))
        head = self.renderer.token_head()
        if self.spec.prompter is not None:  # images counted from their sizes, as `count` does
            name = head.side_prompt(side, prompt_name, prompt, self.prompts)
            return [head.read_length(side, n) for n in self.count(items, self.resolve_prompt(name, prompt))]
        sides = self.renderer.multivector(self._parts(items), side, prompt_name=prompt_name, prompt=prompt)
        return [len(s.tokenized.token_ids) for s in sides]

    def count_static(self, items: Sequence[Any], prompt: str) -> list[int]:
        """Inference-free queries' tokens, as the pools count them (engine/static.py)."""
        return [len(t.token_ids) for t in self.renderer.static(self._parts(items), prompt)]

    def count_pairs(self, query: str, documents: Sequence[str], instruction: str | None) -> list[int]:
        """Tokens per (query, document) pair, uncut; raises naming the first bad document."""
        if Output.MULTIVECTOR in self.spec.outputs and Output.SCORES not in self.spec.outputs:
            # MaxSim: each document a sequence of its own, the query one more (counted with the first)
            counts = self.count_multivector(documents, "document", None, None)
            counts[0] += self.count_multivector([query], "query", None, None)[0]
            return counts
        self._serves("rerank")
        return [len(t.token_ids) for t in self.renderer.pairs(query, documents, "error", instruction)]

    def count_classify(self, items: Sequence[str | tuple[str, str]]) -> list[int]:
        """Tokens per text or (text, text_pair) pair, as a classifier reads it (engine/classify.py);
        raises naming the first bad input."""
        self._serves("classify", "rerank")
        return [len(t.token_ids) for t in self.renderer.classify(list(items), "error")]

    def _serves(self, *tasks: str) -> None:
        """The route's refusal of a model served for another task, in the pools' words."""
        if self.spec.task not in tasks:
            raise InvalidInputError(wrong_task(self.model_name, self.spec.task))

    def _parts(self, items: Sequence[Any]) -> Sequence[Any]:
        """A text model's inputs with each image part list as an image marker, which the renderer
        refuses naming the model; a multimodal model's as they are (`count` reads their sizes)."""
        return items if self.spec.prompter is not None else [_text_only(x) for x in items]


def _size(part: Any) -> tuple[int, int]:
    """An image part's (width, height), from its header (api/multimodal.py)."""
    return image_size(part.url)


def _text_only(item: Any) -> Any:
    """A part list with an image becomes an image marker, so `text_items` refuses it by name."""
    if isinstance(item, list) and any(isinstance(p, ImageURL) for p in item):
        return [ImagePart(b"")]
    return item
