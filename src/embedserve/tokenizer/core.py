"""Tokenization, prompts and the truncation policy.

The model's own post-processor adds its special tokens (Qwen3-Embedding appends
`<|endoftext|>`, BERT wraps in [CLS] ... [SEP]); we never add them a second time. Truncation
cuts the *content* and re-applies the post-processor, so last-token pooling still reads the
end token:

    text ids:   [c0 c1 ... c_{n-1}]  --truncate to L - specials-->  [c0 .. c_{k-1}]
    post-proc:  [lead..] c0 .. c_{k-1} [..trail]                    (len == L)
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Encoding
from tokenizers import Tokenizer as HFTokenizer

from embedserve.errors import InputTooLongError, InvalidInputError
from embedserve.vision.state import MultimodalState

if TYPE_CHECKING:  # an input's late-chunk spans are attached later (tokenizer/late.py)
    from embedserve.pooling.chunks import LateChunks


class Truncate(str, enum.Enum):
    ERROR = "error"
    END = "end"  # drop content from the end
    START = "start"  # drop content from the start

    @classmethod
    def parse(cls, value: str | Truncate) -> Truncate:
        try:
            return cls(value)
        except ValueError:
            raise InvalidInputError(
                f"unknown truncate policy {value!r}; choose 'error', 'end' or 'start'"
            ) from None


@dataclass(frozen=True)
class Tokenized:
    token_ids: list[int]
    truncated: bool
    # Leading positions that belong to the prompt (excluded by MEAN pooling without prompt).
    prompt_tokens: int = 0
    # A (query, document) pair's segment ids, for encoders with token types (tokenizer/pairs.py).
    token_type_ids: list[int] | None = None
    # Images of a multimodal input: spans, M-RoPE positions (vision/state.py); None: text only.
    multimodal: MultimodalState | None = None
    # A late-chunked document: its chunks' token spans, one vector each (tokenizer/late.py).
    late: LateChunks | None = None
    # An inference-free SPLADE query: answered from static weights, no model (engine/static.py).
    static: bool = False


class Tokenizer:
    def __init__(self, tokenizer: str | Path | HFTokenizer, vocab_size: int) -> None:
        # A path to tokenizer.json, or one built in memory (a GGUF file's vocabulary).
        self._tok = tokenizer if isinstance(tokenizer, HFTokenizer) else HFTokenizer.from_file(str(tokenizer))
        self._tok.no_truncation()
        self._tok.no_padding()
        self.vocab_size = vocab_size
        # What the post-processor wraps around content, measured once on a one-word probe.
        probe = self._tok.post_process(self._tok.encode("a", add_special_tokens=False))
        self.num_special = self._tok.num_special_tokens_to_add(is_pair=False)
        self._lead_len = _leading_specials(probe.sequence_ids)

    @property
    def backend(self) -> HFTokenizer:
        return self._tok

    def count_prompt_tokens(self, prompt: str) -> int:
        """Positions a prompt occupies at the start of a sequence, leading specials included."""
        if not prompt:
            return 0
        return self._lead_len + len(self._tok.encode(prompt, add_special_tokens=False).ids)

    def encode(self, text: str, max_len: int, truncate: Truncate, prompt: str = "") -> Tokenized:
        enc, truncated = self.encoding(text, max_len, truncate, prompt)
        ids = enc.ids
        prompt_tokens = self.count_prompt_tokens(prompt) if prompt else 0
        return Tokenized(token_ids=list(ids), truncated=truncated, prompt_tokens=min(prompt_tokens, len(ids)))

    def encoding(
        self, text: str, max_len: int, truncate: Truncate, prompt: str = "", special: bool = True
    ) -> tuple[Encoding, bool]:
        """`prompt + text` encoded as `encode` counts it (its ids, character offsets in
        `prompt + text` and special-token mask), and whether it was cut; `special=False`:
        without the post-processor's special tokens (`/tokenize`'s add_special_tokens)."""
        if not isinstance(text, str):
            raise InvalidInputError(f"expected a string, got {type(text).__name__}")
        if text == "":
            raise InvalidInputError("input is an empty string")
        enc = self._tok.encode(prompt + text, add_special_tokens=False)
        n_special = self.num_special if special else 0
        truncated = False
        if len(enc.ids) + n_special > max_len:
            if truncate is Truncate.ERROR:
                raise InputTooLongError(len(enc.ids) + n_special, max_len)
            enc.truncate(
                max(max_len - n_special, 0), direction="right" if truncate is Truncate.END else "left"
            )
            truncated = True
        return (self._tok.post_process(enc) if special else enc), truncated

    def check_ids(self, ids: list[int], max_len: int, truncate: Truncate) -> Tokenized:
        """Validate caller-supplied token ids (taken as the final sequence, specials included)."""
        if len(ids) == 0:
            raise InvalidInputError("input is an empty token list")
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise InvalidInputError(f"token id {t!r} is outside the vocabulary [0, {self.vocab_size})")
        if len(ids) <= max_len:
            return Tokenized(token_ids=list(ids), truncated=False)
        if truncate is Truncate.ERROR:
            raise InputTooLongError(len(ids), max_len)
        # Keep the special tokens at both ends (as for text), cut the content between them.
        lead = self._lead_len
        trail = self.num_special - lead
        body = ids[lead : len(ids) - trail]
        keep = max(max_len - self.num_special, 0)
        body = body[:keep] if truncate is Truncate.END else body[len(body) - keep :]
        return Tokenized(token_ids=ids[:lead] + body + ids[len(ids) - trail :], truncated=True)


def resolve_prompt(
    prompts: Mapping[str, str], default_name: str | None, prompt_name: str | None, prompt: str | None
) -> str:
    """Explicit prompt text, else a named prompt, else the model's default prompt, else none."""
    if prompt_name is not None and prompt is not None:
        raise InvalidInputError("pass either prompt_name or prompt, not both")
    if prompt is not None:
        return prompt
    name = prompt_name if prompt_name is not None else default_name
    if name is None:
        return ""
    if name not in prompts:
        known = ", ".join(sorted(prompts)) or "none"
        raise InvalidInputError(f"unknown prompt name {name[:80]!r}; this model defines: {known}")
    return prompts[name]


def tokenize_inputs(
    tokenizer: Tokenizer, inputs: str | Sequence[Any], prompt: str, limit: int, truncate: Truncate
) -> list[Tokenized]:
    """Tokenize and validate every input (strings or token-id lists); raises naming the first bad one."""
    items: Sequence[Any] = [inputs] if isinstance(inputs, str) else inputs
    if len(items) == 0:
        raise InvalidInputError("inputs is empty: pass at least one string or token list")
    out: list[Tokenized] = []
    for i, item in enumerate(items):
        try:
            if isinstance(item, str):
                out.append(tokenizer.encode(item, limit, truncate, prompt))
            elif isinstance(item, (list, tuple)):
                if prompt:
                    raise InvalidInputError(
                        "a prompt cannot be combined with token-id inputs; include its tokens"
                    )
                out.append(tokenizer.check_ids(list(item), limit, truncate))
            else:
                raise InvalidInputError(
                    f"expected a string or a list of token ids, got {type(item).__name__}"
                )
        except InputTooLongError as e:
            raise InputTooLongError(e.num_tokens, e.limit, index=i) from None
        except InvalidInputError as e:
            raise InvalidInputError(f"input {i}: {e}") from None
    return out


def _leading_specials(sequence_ids: list[int | None]) -> int:
    n = 0
    for s in sequence_ids:
        if s is not None:
            break
        n += 1
    return n
