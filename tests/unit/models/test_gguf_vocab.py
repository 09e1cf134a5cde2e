"""llama.cpp's WordPiece (`bert`) and SentencePiece (`llama`) vocabularies rebuilt from GGUF
metadata, against the Hugging Face tokenizers they were converted from."""

from __future__ import annotations

from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors, trainers

from embedserve.errors import ModelLoadError
from embedserve.models.gguf_vocab import sentencepiece_merges, sentencepiece_tokenizer, wordpiece_tokenizer
from tests.helpers.gguf_encoders import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, wordpiece_metadata
from tests.helpers.real_text import documents
from tests.helpers.tiny_bert import minilm_dir

SAMPLES = [
    "Hello, World! naïve café 北京 don't",
    "  leading blanks, runs   of    spaces and a trailing one ",
    "tabs\t\tand\n\nnewlines\n\n\n",
    "<start_of_turn>user\nhi<end_of_turn> [MASK] [CLS]",
    "emoji 🚀🧪, ligature ﬁ, ½ Ⅷ \u211d, zero\u200bwidth",
    "x" * 120,
    "the pressure distribution on a swept wing in supersonic flow",
]


def _meta(values: dict[str, Any]) -> Any:
    return lambda key, default=None: values.get(key, default)


def _wordpiece_meta(cased: bool = False) -> dict[str, Any]:
    m = wordpiece_metadata(minilm_dir())
    tokens = list(m["tokens"])
    if cased:  # a cased vocabulary: one piece with a capital
        tokens[tokens.index("\u2581hello")] = "\u2581Hello"
    return {
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": m["types"],
        "tokenizer.ggml.bos_token_id": m["bos"], "tokenizer.ggml.seperator_token_id": m["sep"],
        "tokenizer.ggml.unknown_token_id": m["unk"],
    }  # fmt: skip


def test_wordpiece_vocabulary_tokenizes_as_minilms_tokenizer() -> None:
    ours = wordpiece_tokenizer(_meta(_wordpiece_meta()))
    ref = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    ref.no_padding()
    ref.no_truncation()
    for text in SAMPLES:
        assert ours.encode(text).ids == ref.encode(text).ids, text
        assert ours.decode(ours.encode(text).ids) == ref.decode(ref.encode(text).ids)
    pair_ours, pair_ref = ours.encode("a query", "the passage"), ref.encode("a query", "the passage")
    assert (pair_ours.ids, pair_ours.type_ids) == (pair_ref.ids, pair_ref.type_ids)


def test_a_cased_wordpiece_vocabulary_keeps_case() -> None:
    cased = wordpiece_tokenizer(_meta(_wordpiece_meta(cased=True)))
    hello = _wordpiece_meta(cased=True)["tokenizer.ggml.tokens"].index("\u2581Hello")
    ids = cased.encode("Hello hello").ids
    assert ids[1] == hello and hello not in ids[2:]  # lowercase "hello" is no longer a piece
    uncased = wordpiece_tokenizer(_meta(_wordpiece_meta()))
    assert uncased.encode("Hello").ids == uncased.encode("hello").ids


def _spm_vocab() -> tuple[list[str], list[float], list[int]]:
    """A Gemma-shaped SentencePiece vocabulary in Hugging Face's spelling: controls, user-defined
    newlines and blank runs (score 0, so their merges tie), bytes, pieces spanning words."""
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.Replace(" ", "\u2581")
    bpe.train_from_iterator(
        documents(), trainers.BpeTrainer(vocab_size=1500, max_token_length=12, show_progress=False)
    )
    learned = [t for t, _ in sorted(bpe.get_vocab().items(), key=lambda kv: kv[1])]
    user = ["\n", "\n\n", "\t", "\u2581\u2581", "\u2581\u2581\u2581", "<b>"]
    fresh = [t for t in learned if t not in user]
    pieces = [t for t in fresh if len(t) > 1] + [t for t in fresh if len(t) == 1]
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", *user]
    tokens += [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN, CONTROL, CONTROL] + [USER_DEFINED] * len(user)
    types += [BYTE] * 256 + [NORMAL] * len(pieces)
    scores = [0.0] * (len(tokens) - len(pieces)) + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


def test_sentencepiece_merges_equal_transformers_generate_merges() -> None:
    from transformers.tokenization_utils_base import generate_merges

    tokens, scores, _ = _spm_vocab()
    vocab = {t: i for i, t in enumerate(tokens)}
    assert sentencepiece_merges(tokens, scores, vocab) == generate_merges(
        vocab, dict(zip(tokens, scores, strict=True))
    )


def test_sentencepiece_vocabulary_tokenizes_as_a_gemma_tokenizer_json() -> None:
    """The reference is assembled as EmbeddingGemma's tokenizer.json is (merges from
    transformers' own generate_merges); the GGUF side as llama.cpp's converter writes it
    (user-defined "▁" as a space)."""
    from transformers.tokenization_utils_base import generate_merges

    tokens, scores, types = _spm_vocab()
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = generate_merges(vocab, dict(zip(tokens, scores, strict=True)))
    ref = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    ref.normalizer = normalizers.Replace(" ", "\u2581")
    ref.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    ref.add_special_tokens(
        [AddedToken(t, normalized=False) for t, k in zip(tokens, types, strict=True) if k == CONTROL]
    )
    ref.add_tokens(
        [AddedToken(t, normalized=False) for t, k in zip(tokens, types, strict=True) if k == USER_DEFINED]
    )
    ref.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>",
        pair="<bos> $A <eos> <bos>:1 $B:1 <eos>:1",
        special_tokens=[("<bos>", 2), ("<eos>", 1)],
    )
    written = [
        t.replace("\u2581", " ") if k == USER_DEFINED else t for t, k in zip(tokens, types, strict=True)
    ]
    ours = sentencepiece_tokenizer(_meta({
        "tokenizer.ggml.tokens": written, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": scores, "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True,
        "tokenizer.ggml.add_space_prefix": False,
    }))  # fmt: skip
    for text in [*SAMPLES, "<b>bold</b>", " ".join(documents())[:3000]]:
        assert ours.encode(text).ids == ref.encode(text).ids, text
        assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == ref.decode(
            ref.encode(text).ids, skip_special_tokens=False
        )
    assert ours.encode("q", "d").ids == ref.encode("q", "d").ids


def test_damaged_vocabularies_are_named() -> None:
    base = _wordpiece_meta()
    with pytest.raises(ModelLoadError, match="3 tokens but 2 token types"):
        wordpiece_tokenizer(
            _meta({"tokenizer.ggml.tokens": ["a", "b", "c"], "tokenizer.ggml.token_type": [1, 1]})
        )
    with pytest.raises(ModelLoadError, match="names no unknown token"):
        wordpiece_tokenizer(_meta({"tokenizer.ggml.tokens": ["\u2581a"], "tokenizer.ggml.token_type": [1]}))
    with pytest.raises(
        ModelLoadError, match=r"tokenizer\.ggml\.seperator_token_id 99999999 is not a token id"
    ):
        wordpiece_tokenizer(_meta({**base, "tokenizer.ggml.seperator_token_id": 99999999}))
    with pytest.raises(ModelLoadError, match="4 tokens but 0 scores"):
        sentencepiece_tokenizer(_meta({"tokenizer.ggml.tokens": ["a", "b", "ab", "<unk>"]}))
