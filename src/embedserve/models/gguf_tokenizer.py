"""A `tokenizers.Tokenizer` rebuilt from a GGUF file's `tokenizer.ggml.*` metadata.

`tokenizer.ggml.model` picks the kind: byte-level BPE (`gpt2`: Llama-3, Qwen, SmolLM) here,
WordPiece (`bert`) and SentencePiece (`llama`: Gemma) in models/gguf_vocab.py. For BPE,
llama.cpp splits text with regexes chosen by `tokenizer.ggml.pre` before BPE; the same split
happens here with `Split` pre-tokenizers, applied in order:

    text --Split(regex 1)--> pieces --Split(regex 2)--> ... --ByteLevel--> BPE(tokens, merges)

Special tokens follow the metadata too: tokens of type CONTROL are matched whole as special
tokens, USER_DEFINED ones as plain added tokens, and BOS / EOS are added only where
`tokenizer.ggml.add_bos_token` / `add_eos_token` (or the pre-tokenizer's llama.cpp default) say.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from embedserve.errors import ModelLoadError
from embedserve.models.gguf_vocab import (
    add_typed_tokens,
    bos_eos_processor,
    sentencepiece_tokenizer,
    vocab_entries,
    wordpiece_tokenizer,
)

# GPT-2's split, with Hugging Face's trailing `\s+` (llama.cpp handles trailing blanks the same).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    regexes: tuple[str, ...]
    add_bos: bool = False  # llama.cpp's default when the file has no add_bos_token
    ignore_merges: bool = False  # a piece that is itself a token skips the merges


_DIGITS_THEN_GPT2 = PreTokenizer((r"\p{N}", _GPT2))
_LLAMA3_PRE = PreTokenizer((_LLAMA3,), add_bos=True, ignore_merges=True)
_QWEN2_PRE = PreTokenizer((_QWEN2,))

# `tokenizer.ggml.pre` -> split rules (the names and groupings of llama.cpp's llama-vocab.cpp).
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "gpt-2": PreTokenizer((_GPT2,)),
    "smollm": _DIGITS_THEN_GPT2,
    "starcoder": _DIGITS_THEN_GPT2,
    "refact": _DIGITS_THEN_GPT2,
    "llama-bpe": _LLAMA3_PRE,
    "llama3": _LLAMA3_PRE,
    "llama-v3": _LLAMA3_PRE,
    "qwen2": _QWEN2_PRE,
    "deepseek-r1-qwen": _QWEN2_PRE,
}


def gguf_tokenizer(meta: Callable[[str, Any], Any]) -> HFTokenizer:
    """`meta(key, default)` reads one metadata value (lists for arrays)."""
    kind = meta("tokenizer.ggml.model", None)
    if kind in _OTHER_KINDS:
        return _OTHER_KINDS[kind](meta)
    if kind != "gpt2":
        known = ", ".join(repr(k) for k in sorted(["gpt2", *_OTHER_KINDS]))
        raise ModelLoadError(f"GGUF tokenizer model {kind!r} is not supported; supported: {known}")
    pre_name = meta("tokenizer.ggml.pre", "default")
    pre = PRE_TOKENIZERS.get(pre_name)
    if pre is None:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise ModelLoadError(f"GGUF pre-tokenizer {pre_name!r} is not supported; supported: {known}")
    tokens, types = vocab_entries(meta)
    merges = [tuple(m.split(" ")) for m in meta("tokenizer.ggml.merges", [])]
    if not merges:
        raise ModelLoadError("the GGUF file has no tokenizer.ggml.merges")
    bad = next((m for m in merges if len(m) != 2), None)
    if bad is not None:
        raise ModelLoadError(f"malformed BPE merge {' '.join(bad)!r} in the GGUF file")
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre.ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    add_typed_tokens(tok, tokens, types)
    tok.post_processor = bos_eos_processor(meta, tokens, pre.add_bos)
    return tok


_OTHER_KINDS: dict[str, Callable[[Callable[[str, Any], Any]], HFTokenizer]] = {
    "bert": wordpiece_tokenizer,
    "llama": sentencepiece_tokenizer,
}
