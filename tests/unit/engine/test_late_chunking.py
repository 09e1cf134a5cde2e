"""Late chunking on the engine: each chunk's vector is the mean of its own rows of one forward
pass over the whole document (transformers' last_hidden_state), whatever cuts the scheduler
makes; spans from the tokenizer's offsets; refusals name the chunk."""

from __future__ import annotations

import itertools
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve import Engine
from embedserve.config import PoolingMethod
from embedserve.engine.builder import build_engine
from embedserve.errors import InputTooLongError, InvalidInputError
from embedserve.request import EmbedParams, Priority, Request
from embedserve.tokenizer import Tokenizer, Truncate
from embedserve.tokenizer.late import join_chunks, tokenize_late
from tests.helpers.engine_calls import embed_late, plan_late
from tests.helpers.engine_calls import tokenize_late as engine_tokenize_late
from tests.helpers.preemption import preempted_vector
from tests.helpers.real_text import long_text, topic
from tests.helpers.reference import hf_model
from tests.helpers.tiny_bert import minilm_dir
from tests.helpers.tiny_models import qwen_tokenizer_dir

# KV bytes per 16-token block of the tiny Qwen3: 2 layers x (k, v) x 16 x 2 kv heads x 32 x 4 B.
BLOCK_BYTES = 2 * 2 * 16 * 2 * 32 * 4


def _chunks(text: str, n: int) -> list[str]:
    """`text` cut into `n` pieces at spaces (each piece keeps the space before its first word)."""
    cuts = [0]
    for k in range(1, n):
        cuts.append(text.index(" ", k * len(text) // n))
    cuts.append(len(text))
    return [text[a:b] for a, b in itertools.pairwise(cuts)]


def _reference(path: Path, ids: list[int], spans: list[tuple[int, int]], last: bool = False) -> np.ndarray:
    """transformers' rows of the whole sequence, each span's mean (or last row), normalized."""
    with torch.inference_mode():
        hidden = hf_model(str(path))(input_ids=torch.tensor([ids])).last_hidden_state[0].float()
    rows = [hidden[b - 1] if last else hidden[a:b].mean(0) for a, b in spans]
    return torch.nn.functional.normalize(torch.stack(rows), dim=-1).numpy()


def _ranges(out: object) -> list[tuple[int, int]]:
    return [c.tokens for c in out.chunks]  # type: ignore[attr-defined]


def _spans_by_rule(path: Path, chunks: list[str]) -> list[tuple[int, int]]:
    """Each chunk's token range by docs/late-chunking.md's rule, from tokenizers directly: a
    token goes to the chunk holding its first non-space character; the trailing
    <|endoftext|> joins the last chunk."""
    from tokenizers import Tokenizer as HF

    text = "".join(chunks)
    enc = HF.from_file(str(path / "tokenizer.json")).encode(text)
    bounds = list(itertools.accumulate(len(c) for c in chunks))
    owner = []
    for (a, b), special in zip(enc.offsets, enc.special_tokens_mask, strict=True):
        if special:
            owner.append(len(chunks) - 1)
            continue
        first = next((i for i in range(a, b) if not text[i].isspace()), a)
        owner.append(next(k for k, end in enumerate(bounds) if first < end))
    return [(owner.index(k), len(owner) - owner[::-1].index(k)) for k in range(len(chunks))]


# ---- spans from the tokenizer ----------------------------------------------------------------


def _qwen_tokenizer(eos: bool) -> Tokenizer:
    from tokenizers import Tokenizer as HF

    tok = HF.from_file(str(qwen_tokenizer_dir() / "tokenizer.json"))
    if eos:
        from tokenizers.processors import TemplateProcessing

        tok.post_processor = TemplateProcessing(
            single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", 151643)]
        )
    return Tokenizer(tok, 151669)


def test_bert_spans_own_their_words_and_the_specials_join_the_ends() -> None:
    tok = Tokenizer(minilm_dir() / "tokenizer.json", 30522)
    text, spans = join_chunks(["Berlin is ", "the capital. ", "It has people."])
    t = tokenize_late(tok, text, 512, Truncate.ERROR, char_spans=spans)
    assert t.late is not None
    got = [(c.index, c.tokens, c.chars) for c in t.late.spans]
    # [CLS] berlin is | the capital . | it has people . [SEP]
    assert got == [(0, (0, 3), (0, 10)), (1, (3, 6), (10, 23)), (2, (6, 11), (23, 37))]
    assert len(t.token_ids) == 11


def test_a_word_goes_with_its_first_character_not_the_space_before_it() -> None:
    tok = _qwen_tokenizer(eos=True)
    # byte-level BPE glues the space to the next word (" capital"): the word's chunk owns it
    text, spans = join_chunks(["Berlin is the ", "capital of Germany"])
    t = tokenize_late(tok, text, 512, Truncate.ERROR, char_spans=spans)
    assert t.late is not None
    first, second = t.late.spans
    words = [tok.backend.decode(t.token_ids[a:b]) for a, b in (first.tokens, second.tokens)]
    assert words[0] == "Berlin is the" and words[1].startswith(" capital of Germany")
    assert second.tokens[1] == len(t.token_ids)  # the trailing <|endoftext|> joins the last chunk


@pytest.mark.parametrize(
    "chunks",
    [
        ["naïve café ", "😀 emoji ", "e\u0301t\u00e9 done"],  # emoji, combining mark at a join
        ["The strawb", "erry fields", " and more"],  # " strawberry" is one token, from chunk 0
        ["日本語の", "テキスト", "です。"],
    ],
)
def test_unicode_at_the_joins_partitions_the_content(chunks: list[str]) -> None:
    tok = _qwen_tokenizer(eos=True)
    text, spans = join_chunks(chunks)
    t = tokenize_late(tok, text, 512, Truncate.ERROR, char_spans=spans)
    assert t.late is not None
    ranges = [c.tokens for c in t.late.spans]
    assert ranges[0][0] == 0 and ranges[-1][1] == len(t.token_ids)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))  # no gap, no overlap
    # one tokenization of the joined text (Qwen's tokenizer composes e + U+0301 into é: NFC)
    assert tok.backend.decode(t.token_ids[:-1]) == unicodedata.normalize("NFC", text)
    if chunks[0] == "The strawb":  # the merged token starts in chunk 0, so chunk 0 owns it
        assert tok.backend.decode(t.token_ids[slice(*ranges[0])]) == "The strawberry"


def test_a_chunk_without_a_token_of_its_own_is_refused_naming_it() -> None:
    tok = _qwen_tokenizer(eos=False)
    text, spans = join_chunks(["The strawb", "er", "ry is red"])  # "strawberry": one token
    with pytest.raises(InvalidInputError, match=r"chunk 1 \(characters \[10, 12\)\) has no token"):
        tokenize_late(tok, text, 512, Truncate.ERROR, char_spans=spans)
    with pytest.raises(InvalidInputError, match="chunk 1 is an empty string"):
        join_chunks(["a", "", "b"])
    with pytest.raises(InvalidInputError, match="input is empty"):
        join_chunks([])


def test_truncation_drops_the_chunks_it_cuts_off_and_refuses_without_it() -> None:
    tok = Tokenizer(minilm_dir() / "tokenizer.json", 30522)
    text, spans = join_chunks(["one two three ", "four five six ", "seven eight nine"])
    with pytest.raises(InputTooLongError):
        tokenize_late(tok, text, 6, Truncate.ERROR, char_spans=spans)
    t = tokenize_late(tok, text, 6, Truncate.END, char_spans=spans)  # [CLS] one two three four [SEP]
    assert t.truncated and t.late is not None
    assert [(c.index, c.tokens) for c in t.late.spans] == [(0, (0, 4)), (1, (4, 6))]
    t = tokenize_late(tok, text, 6, Truncate.START, char_spans=spans)
    # [CLS] six | seven eight nine [SEP]
    assert t.late is not None and [(c.index, c.tokens) for c in t.late.spans] == [(1, (0, 2)), (2, (2, 6))]


def test_chunk_size_runs_of_content_tokens_with_their_characters() -> None:
    tok = Tokenizer(minilm_dir() / "tokenizer.json", 30522)
    text = "alpha beta gamma delta epsilon"
    t = tokenize_late(tok, text, 512, Truncate.ERROR, chunk_size=2)
    assert t.late is not None
    assert [(c.tokens, text[slice(*c.chars)]) for c in t.late.spans] == [
        ((0, 3), "alpha beta"),
        ((3, 5), "gamma delta"),
        ((5, 7), "epsilon"),
    ]


def test_the_prompt_belongs_to_no_span() -> None:
    tok = Tokenizer(minilm_dir() / "tokenizer.json", 30522)
    t = tokenize_late(tok, "red apples", 512, Truncate.ERROR, char_spans=[(0, 3), (4, 10)], prompt="query: ")
    assert t.late is not None
    # [CLS] query : | red | apples [SEP]
    assert [c.tokens for c in t.late.spans] == [(3, 4), (4, 6)] and t.prompt_tokens == 3


# ---- vectors against transformers -------------------------------------------------------------


def test_parity_with_transformers_across_budgets_and_the_lane(qwen3_dir: Path) -> None:
    chunks = _chunks(long_text(6000), 7)
    runs = {
        "whole": {"max_num_batched_tokens": 4096, "layer_major_tokens": 0},
        "cuts inside spans": {"max_num_batched_tokens": 97, "layer_major_tokens": 0},
        "layer-major lane": {"max_num_batched_tokens": 256, "layer_major_tokens": 64},
    }
    ref = None
    for name, options in runs.items():
        with Engine.from_pretrained(qwen3_dir, max_model_len=4096, **options) as engine:
            out = embed_late(engine, chunks)
            if name == "layer-major lane":
                assert engine.stats()["layer_major_finished"] == 1
        ids = engine_tokenize_late(engine, chunks).token_ids
        if ref is None:  # the spans by the documented rule, from the tokenizer alone
            assert _ranges(out) == _spans_by_rule(qwen3_dir, chunks)
            ref = _reference(qwen3_dir, ids, _ranges(out))
        assert out.embeddings.shape == (7, 64) and [c.index for c in out.chunks] == list(range(7))
        np.testing.assert_allclose(out.embeddings, ref, atol=1e-5, err_msg=name)


def test_late_chunks_carry_the_document_unlike_separate_chunks(qwen3_dir: Path) -> None:
    chunks = _chunks(topic("assert"), 3)
    with Engine.from_pretrained(qwen3_dir, pooling="mean") as engine:
        late = embed_late(engine, chunks).embeddings
        alone = engine.embed(chunks)
    # causal: chunk 0 sees only itself (alone it also pools its own end token); the others see
    # the text before them
    gap = 1 - np.sum(late * alone, axis=1)
    assert gap[0] < gap[1:].min() / 2 and gap[1:].min() > 1e-3


def test_one_chunk_is_the_models_own_mean_and_last_pooling(qwen3_dir: Path) -> None:
    text = topic("assert")
    with Engine.from_pretrained(qwen3_dir, pooling="mean") as engine:
        assert np.array_equal(embed_late(engine, [text]).embeddings[0], engine.embed([text])[0])
    # last-token pooling; no prefix cache (the second request would start from the first's K/V)
    with Engine.from_pretrained(qwen3_dir, enable_prefix_caching=False) as engine:
        one = embed_late(engine, [text], span_pooling="last").embeddings[0]
        assert np.array_equal(one, engine.embed([text])[0])
    with Engine.from_pretrained(minilm_dir()) as engine:  # real MiniLM weights, MEAN pooling
        assert np.array_equal(embed_late(engine, [text[:900]]).embeddings[0], engine.embed([text[:900]])[0])
        with pytest.raises(InvalidInputError, match="bidirectional encoder: use 'mean'"):
            embed_late(engine, [text], span_pooling="last")


def test_span_last_rows_match_transformers(qwen3_dir: Path) -> None:
    chunks = _chunks(topic("assert"), 4)
    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=64) as engine:
        out = embed_late(engine, chunks, span_pooling="last", dimensions=48)
        ids = engine_tokenize_late(engine, chunks).token_ids
    with torch.inference_mode():
        hidden = hf_model(str(qwen3_dir))(input_ids=torch.tensor([ids])).last_hidden_state[0].float()
    rows = torch.stack([hidden[b - 1, :48] for _, b in _ranges(out)])  # Matryoshka: slice, then normalize
    np.testing.assert_allclose(out.embeddings, torch.nn.functional.normalize(rows, dim=-1).numpy(), atol=1e-5)


def test_deterministic_mode_is_bit_identical_across_budgets(qwen3_dir: Path) -> None:
    chunks = _chunks(long_text(5000), 5)
    got = []
    for budget, lane in ((256, 0), (512, 0), (2048, 0), (512, 300)):
        with Engine.from_pretrained(
            qwen3_dir, deterministic=True, max_num_batched_tokens=budget, layer_major_tokens=lane
        ) as engine:
            got.append(embed_late(engine, chunks).embeddings)
    assert all(np.array_equal(got[0], g) for g in got[1:])


def test_preemption_mid_span_changes_nothing(qwen3_dir: Path) -> None:
    chunks = _chunks(long_text(5000)[:5500], 6)
    core = build_engine(
        qwen3_dir, max_num_batched_tokens=128, kv_cache_memory=90 * BLOCK_BYTES, layer_major_tokens=0
    ).core
    with Engine.from_pretrained(qwen3_dir) as engine:
        tok = engine_tokenize_late(engine, chunks)
        alone = embed_late(engine, chunks).embeddings
    assert tok.late is not None and 1000 < len(tok.token_ids) <= 1440
    doc = Request(
        0, tok.token_ids, EmbedParams(normalize=True), PoolingMethod.LAST, Priority.BATCH, late=tok.late
    )
    np.testing.assert_allclose(preempted_vector(core, doc), alone, atol=1e-5)


def test_refusals_name_the_problem(qwen3_dir: Path) -> None:
    with Engine.from_pretrained(qwen3_dir) as engine:
        with pytest.raises(InvalidInputError, match="overlaps"):
            embed_late(engine, "abcdefghij", chunk_spans=[[0, 5], [4, 8]])
        with pytest.raises(InvalidInputError, match="outside the document"):
            embed_late(engine, "abcdefghij", chunk_spans=[[0, 11]])
        with pytest.raises(InvalidInputError, match="chunk_spans or a chunk size"):
            embed_late(engine, "abcdefghij")
        with pytest.raises(InvalidInputError, match="span_pooling must be"):
            embed_late(engine, ["a b"], span_pooling="max")
        with pytest.raises(InvalidInputError, match="chunk_size must be a positive"):
            embed_late(engine, "a b c", chunk_size=0)
        with pytest.raises(InvalidInputError, match="span_pooling must be"):
            embed_late(engine, ["a b"], span_pooling="sum")  # internal: a long document's window parts
        with pytest.raises(InvalidInputError, match="dimensions must be"):
            embed_late(engine, ["a b"], long=True, dimensions=0)
        with pytest.raises(InvalidInputError, match="overlap applies to long documents"):
            embed_late(engine, ["a b"], overlap=4)
        with pytest.raises(InvalidInputError, match="truncate does not apply"):
            embed_late(engine, ["a b"], long=True, truncate="end")
        assert engine.embed(["still fine"]).shape == (1, 64)


# ---- documents longer than the model's input: overlapping windows ----------------------------


def _windowed_rows(
    path: Path, ids: list[int], content: tuple[int, int], max_len: int, overlap: int
) -> torch.Tensor:
    """Each position's row from the one window that owns it (docs/late-chunking.md): windows of
    prefix + at most W content tokens + suffix, a later window's first `overlap` tokens context only."""
    c0, c_end = content
    prefix, suffix = ids[:c0], ids[c_end:]
    width = max_len - len(prefix) - len(suffix)
    rows: list[torch.Tensor | None] = [None] * len(ids)
    start = c0
    with torch.inference_mode():
        while True:
            end = min(start + width, c_end)
            window = prefix + ids[start:end] + suffix
            hidden = hf_model(str(path))(input_ids=torch.tensor([window])).last_hidden_state[0].float()
            positions = list(range(c0)) + list(range(start, end)) + list(range(c_end, len(ids)))
            first = c0 if start == c0 else start + overlap
            for local, p in enumerate(positions):
                owned = (p < c0 and start == c0) or (first <= p < end) or (p >= c_end and end == c_end)
                if owned:
                    rows[p] = hidden[local]
            if end == c_end:
                break
            start = end - overlap
    assert all(r is not None for r in rows)
    return torch.stack(rows)  # type: ignore[arg-type]


@pytest.mark.parametrize("span_pooling", ["mean", "last"])
def test_long_documents_run_as_windows_like_the_reference(qwen3_dir: Path, span_pooling: str) -> None:
    doc = long_text(7000)[:7000]
    with Engine.from_pretrained(qwen3_dir, max_model_len=512, max_num_batched_tokens=256) as engine:
        out = embed_late(engine, doc, chunk_size=100, span_pooling=span_pooling, long=True, overlap=64)
        plan = plan_late(engine, doc, chunk_size=100, span_pooling=span_pooling, long=True, overlap=64)
        with pytest.raises(InputTooLongError):
            embed_late(engine, doc, chunk_size=100)
    ids = plan.document.token_ids
    assert len(ids) > 1200 and out.windows == len(plan.windows) >= 3 and out.overlap == 64
    assert all(len(w.token_ids) <= 512 for w in plan.windows)
    rows = _windowed_rows(qwen3_dir, ids, (0, len(ids) - 1), 512, 64)  # content: all but <|endoftext|>
    spans = [c.tokens for c in out.chunks]
    pooled = [rows[b - 1] if span_pooling == "last" else rows[a:b].mean(0) for a, b in spans]
    want = torch.nn.functional.normalize(torch.stack(pooled), dim=-1).numpy()
    np.testing.assert_allclose(out.embeddings, want, atol=1e-5)


def test_long_windows_on_an_encoder_and_a_document_that_fits() -> None:
    doc = topic("assert")
    with Engine.from_pretrained(minilm_dir(), max_model_len=128) as engine:
        out = embed_late(engine, doc, chunk_size=40, long=True, overlap=16, dimensions=200)
        ids = plan_late(engine, doc, chunk_size=40, long=True, overlap=16).document.token_ids
        short = embed_late(engine, doc[:300], chunk_size=20, long=True)
        assert short.windows == 1 and np.array_equal(
            short.embeddings, embed_late(engine, doc[:300], chunk_size=20).embeddings
        )
        with pytest.raises(
            InvalidInputError, match=r"overlap \(63 tokens, late_overlap\) must be under half"
        ):
            embed_late(engine, doc, chunk_size=40, long=True, overlap=63)
    assert out.windows > 1
    rows = _windowed_rows(minilm_dir(), ids, (1, len(ids) - 1), 128, 16)  # [CLS] ... [SEP]
    pooled = torch.stack([rows[a:b].mean(0)[:200] for a, b in (c.tokens for c in out.chunks)])
    np.testing.assert_allclose(
        out.embeddings, torch.nn.functional.normalize(pooled, dim=-1).numpy(), atol=1e-5
    )
