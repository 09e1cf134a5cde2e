"""Token counts at the gateway, exactly as the pools' engines will count them.

The counter opens the model the pools serve (directory or .gguf file): its tokenizer (post-processor
special tokens included), its prompt table and default prompt name, and resolves prompts
with the engine's rules, so a routing decision never disagrees with the engine's length check.
Every response's per-input `num_tokens` is compared with these counts (count mismatches metric).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from embedserve.errors import InvalidInputError
from embedserve.models.build import open_model
from embedserve.tokenizer import Tokenizer, Truncate

# Counting never truncates: the full length decides the pool (and the over-long policy).
_NO_LIMIT = sys.maxsize


class TokenCounter:
    def __init__(self, model_path: str | Path) -> None:
        # A model directory or .gguf file, opened as the engine opens it; weights are not read.
        source = open_model(model_path)
        self.model_path = str(source.path)
        self.tokenizer = Tokenizer(source.tokenizer(), source.model.vocab_size)
        self.prompts = dict(source.prompts)
        self.default_prompt_name = source.default_prompt_name

    def resolve_prompt(self, prompt_name: str | None, prompt: str | None) -> str:
        """The engine's rules (Engine.resolve_prompt): explicit text, else a named prompt,
        else the model's default prompt name, else none."""
        if prompt_name is not None and prompt is not None:
            raise InvalidInputError("pass either prompt_name or prompt, not both")
        if prompt is not None:
            return prompt
        name = prompt_name if prompt_name is not None else self.default_prompt_name
        if name is None:
            return ""
        if name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none"
            raise InvalidInputError(f"unknown prompt name {name!r}; this model defines: {known}")
        return self.prompts[name]

    def count(self, items: Sequence[str | list[int]], prompt: str) -> list[int]:
        """Tokens per input (prompt and special tokens included); raises naming the first bad one."""
        if not items:
            raise InvalidInputError("input is empty: pass at least one string or token list")
        counts = []
        for i, item in enumerate(items):
            try:
                if isinstance(item, str):
                    counts.append(
                        len(self.tokenizer.encode(item, _NO_LIMIT, Truncate.ERROR, prompt).token_ids)
                    )
                elif prompt:
                    raise InvalidInputError(
                        "a prompt cannot be combined with token-id inputs; include its tokens"
                    )
                else:
                    counts.append(
                        len(self.tokenizer.check_ids(list(item), _NO_LIMIT, Truncate.ERROR).token_ids)
                    )
            except InvalidInputError as e:
                raise InvalidInputError(f"input {i}: {e}") from None
        return counts
