"""llama.cpp's WordPiece (`bert`) and SentencePiece (`llama`) vocabularies, rebuilt as
`tokenizers.Tokenizer`s that encode as the model's own Hugging Face tokenizer does.

- `bert`: llama.cpp stores a word-initial piece with a leading "▁" (its phantom space) and a
  continuation piece bare; here they are `word` and `##piece` again. The text is normalized as
  BertTokenizer does for the vocabulary's casing: an uncased vocabulary (no capital letter in
  any piece) is lowercased and its accents stripped, a cased one is left as written. [CLS] and
  [SEP] (the file's BOS / separator ids) frame every sequence, pairs as `[CLS] a [SEP] b [SEP]`.
- `llama` (Gemma, Llama 2, Mistral): pieces with scores. The merges are derived from the scores
  as Hugging Face's converter derives them from a SentencePiece model (every split of a piece
  into two pieces of the vocabulary; highest score first, then the longer left piece, then the
  longer right one), which reproduces the merge list of EmbeddingGemma's tokenizer.json exactly.
  Spaces become "▁" (plus a leading one where `add_space_prefix`), unknown bytes `<0xNN>`.

Tokens of type CONTROL are matched whole as special tokens, USER_DEFINED ones as plain added
tokens (Gemma's "\\n\\n", tabs, HTML tags), as in the Hugging Face files; llama.cpp's
converter wrote the "▁" of a user-defined piece as a space, which is undone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from embedserve.errors import ModelLoadError

Meta = Callable[[str, Any], Any]
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp token types
PHANTOM = "\u2581"


def vocab_entries(meta: Meta) -> tuple[list[str], list[int]]:
    tokens: list[str] = list(meta("tokenizer.ggml.tokens", None) or [])
    if not tokens:
        raise ModelLoadError("the GGUF file has no tokenizer.ggml.tokens")
    types: list[int] = list(meta("tokenizer.ggml.token_type", None) or [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise ModelLoadError(f"the GGUF file has {len(tokens)} tokens but {len(types)} token types")
    return tokens, types


def add_typed_tokens(tok: HFTokenizer, tokens: list[str], types: list[int]) -> None:
    typed = list(zip(tokens, types, strict=True))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in typed if k == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in typed if k == USER_DEFINED])


def _token_id(meta: Meta, key: str, tokens: list[str]) -> int | None:
    value = meta(f"tokenizer.ggml.{key}", None)
    if value is None:
        return None
    if not 0 <= int(value) < len(tokens):
        raise ModelLoadError(f"the GGUF file's tokenizer.ggml.{key} {value} is not a token id")
    return int(value)


def bos_eos_processor(
    meta: Meta, tokens: list[str], add_bos: bool, pair: bool = False
) -> processors.PostProcessor:
    """BOS / EOS around every sequence, as the metadata asks (and never twice)."""
    lead: list[tuple[str, int]] = []
    trail: list[tuple[str, int]] = []
    for key, default, where in (("bos", add_bos, lead), ("eos", False, trail)):
        if not meta(f"tokenizer.ggml.add_{key}_token", default):
            continue
        token_id = _token_id(meta, f"{key}_token_id", tokens)
        if token_id is None:
            raise ModelLoadError(f"the GGUF file asks to add a {key.upper()} token but names no valid one")
        where.append((tokens[token_id], token_id))
    return _template(lead, trail, pair)


def _template(
    lead: list[tuple[str, int]], trail: list[tuple[str, int]], pair: bool
) -> processors.PostProcessor:
    def frame(seq: str, type_id: int) -> list[str]:
        return (
            [f"{t}:{type_id}" for t, _ in lead] + [f"${seq}:{type_id}"] + [f"{t}:{type_id}" for t, _ in trail]
        )

    specials = list(dict.fromkeys(lead + trail))
    if not pair:
        return processors.TemplateProcessing(single=" ".join(frame("A", 0)), special_tokens=specials)
    return processors.TemplateProcessing(
        single=" ".join(frame("A", 0)), pair=" ".join(frame("A", 0) + frame("B", 1)), special_tokens=specials
    )


def wordpiece_tokenizer(meta: Meta) -> HFTokenizer:
    tokens, types = vocab_entries(meta)
    vocab: dict[str, int] = {}
    for i, (piece, kind) in enumerate(zip(tokens, types, strict=True)):
        word = (
            piece if kind in (CONTROL, UNKNOWN) else piece[1:] if piece.startswith(PHANTOM) else f"##{piece}"
        )
        if word and word != "##":
            vocab.setdefault(word, i)
    unk = _token_id(meta, "unknown_token_id", tokens)
    unk_token = tokens[unk] if unk is not None else "[UNK]"
    if unk_token not in vocab:
        raise ModelLoadError("the GGUF WordPiece vocabulary names no unknown token")
    cls = _token_id(meta, "bos_token_id", tokens)
    sep = _token_id(meta, "seperator_token_id", tokens)  # llama.cpp's spelling
    sep = _token_id(meta, "eos_token_id", tokens) if sep is None else sep
    cls, sep = (vocab.get("[CLS]") if cls is None else cls), (vocab.get("[SEP]") if sep is None else sep)
    if cls is None or sep is None:
        raise ModelLoadError("the GGUF WordPiece vocabulary names no [CLS] (BOS) or [SEP] token")
    # cased: some piece changes when lowercased (a double-struck R is upper case yet its own lower)
    uncased = all(piece == piece.lower() for piece, kind in zip(tokens, types, strict=True) if kind == NORMAL)
    tok = HFTokenizer(models.WordPiece(vocab, unk_token=unk_token, max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=uncased
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    add_typed_tokens(tok, tokens, [CONTROL if k == UNKNOWN else k for k in types])
    cls_t, sep_t = tokens[cls], tokens[sep]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls_t} $A {sep_t}",
        pair=f"{cls_t} $A {sep_t} $B:1 {sep_t}:1",
        special_tokens=[(cls_t, cls), (sep_t, sep)],
    )
    return tok


def sentencepiece_merges(
    tokens: list[str], scores: list[float], vocab: dict[str, int]
) -> list[tuple[str, str]]:
    """BPE merges from SentencePiece scores: each piece's splits into two known pieces, ranked by
    the piece's score, then the longer left piece, then the longer right piece (a stable sort
    keeps a piece's splits in the order of their ids)."""
    ranked: list[tuple[float, str, str]] = []
    for i, (piece, score) in enumerate(zip(tokens, scores, strict=True)):
        if vocab.get(piece) != i:
            continue  # a repeated piece counts once, at its first id
        splits = sorted(
            (vocab[piece[:k]], vocab[piece[k:]], piece[:k], piece[k:])
            for k in range(1, len(piece))
            if piece[:k] in vocab and piece[k:] in vocab
        )
        ranked.extend((score, left, right) for _, _, left, right in splits)
    ranked.sort(key=lambda m: (m[0], len(m[1]), len(m[2])), reverse=True)
    return [(left, right) for _, left, right in ranked]


def sentencepiece_tokenizer(meta: Meta) -> HFTokenizer:
    tokens, types = vocab_entries(meta)
    # llama.cpp's converter spells a user-defined piece's "▁" as a space (Gemma's "▁▁" as "  ");
    # the Hugging Face vocabulary, whose merges build such runs from "▁", spells it "▁"
    tokens = [t.replace(" ", PHANTOM) if k == USER_DEFINED else t for t, k in zip(tokens, types, strict=True)]
    scores = [float(s) for s in meta("tokenizer.ggml.scores", None) or []]
    if len(scores) != len(tokens):
        raise ModelLoadError(f"the GGUF file has {len(tokens)} tokens but {len(scores)} scores")
    vocab: dict[str, int] = {}
    for i, piece in enumerate(tokens):
        vocab.setdefault(piece, i)
    unk = _token_id(meta, "unknown_token_id", tokens)
    unk = next((i for i, k in enumerate(types) if k == UNKNOWN), None) if unk is None else unk
    model = models.BPE(
        vocab=vocab,
        merges=sentencepiece_merges(tokens, scores, vocab),
        unk_token=None if unk is None else tokens[unk],
        fuse_unk=True,
        byte_fallback=True,
    )
    tok = HFTokenizer(model)
    prefix = bool(meta("tokenizer.ggml.add_space_prefix", True))  # llama.cpp's default
    spaces = normalizers.Replace(" ", PHANTOM)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(PHANTOM), spaces]) if prefix else spaces
    steps = [decoders.Replace(PHANTOM, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    add_typed_tokens(tok, tokens, types)
    tok.post_processor = bos_eos_processor(meta, tokens, add_bos=True, pair=True)
    return tok
