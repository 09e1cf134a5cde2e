"""GGUF files: tiny decoders written like llama.cpp does, engine vs transformers, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer

from embedserve import Engine
from embedserve.config import PoolingMethod
from embedserve.errors import ModelLoadError
from embedserve.models.gguf_tokenizer import gguf_tokenizer
from tests.helpers.reference import cosine, hf_embed_ids
from tests.helpers.tiny_gguf import EOS, build_gguf_pair, train_tokenizer
from tests.helpers.tiny_models import qwen_tokenizer_dir

FP32_MIN_COSINE = 0.99999
LENGTHS = [1, 17, 300, 1200]
TEXTS = ["wing flutter at 1200 ft/s", "x", "Pressure distribution.\n\n  Two   blanks", "été — naïve 北京"]


@pytest.fixture(scope="module")
def tok() -> HFTokenizer:
    return train_tokenizer()


@pytest.fixture(scope="module")
def gguf_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf")


def _seqs(vocab: int) -> list[list[int]]:
    gen = np.random.default_rng(5)
    return [[int(x) for x in gen.integers(0, vocab - 1, n)] for n in LENGTHS]


def _transformers_from_gguf(gguf_file: Path, seqs: list[list[int]]) -> np.ndarray:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32).eval()
    with torch.inference_mode():
        last = [model(input_ids=torch.tensor([s])).last_hidden_state[0, -1] for s in seqs]
    return torch.nn.functional.normalize(torch.stack(last), dim=-1).numpy()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_decoder_matches_transformers_on_the_same_file(
    gguf_root: Path, tok: HFTokenizer, arch: str
) -> None:
    # float16 matrices as llama.cpp writes them; llama's Q/K rows interleaved by the converter.
    _, gguf_file = build_gguf_pair(gguf_root / "f16", arch, tok, f16=True)
    seqs = _seqs(tok.get_vocab_size())
    ref = _transformers_from_gguf(gguf_file, seqs)
    with Engine.from_pretrained(gguf_file, max_num_batched_tokens=64) as engine:  # forces chunks
        assert engine.config.pooling.method is PoolingMethod.LAST and engine.config.pooling.normalize
        got = engine.embed(seqs)
        assert engine.stats()["steps"] >= sum(LENGTHS) // 64
    assert cosine(got, ref).min() >= FP32_MIN_COSINE, cosine(got, ref)


def test_qwen3_gguf_matches_its_source_directory(gguf_root: Path, tok: HFTokenizer) -> None:
    # head_dim 32 != hidden / heads: only `attention.key_length` in the metadata says so.
    hf_dir, gguf_file = build_gguf_pair(gguf_root / "f32", "qwen3", tok)
    seqs = _seqs(tok.get_vocab_size())
    with Engine.from_pretrained(gguf_file, max_num_batched_tokens=100) as engine:
        assert engine.config.model.head_dim == 32 and engine.config.model.qk_norm
        got = engine.embed(seqs)
        by_text = engine.embed(TEXTS)
        assert [t.token_ids for t in engine.renderer.text(TEXTS)] == [tok.encode(t).ids for t in TEXTS]
    assert cosine(got, hf_embed_ids(hf_dir, seqs)).min() >= FP32_MIN_COSINE
    assert cosine(by_text, hf_embed_ids(hf_dir, [tok.encode(t).ids for t in TEXTS])).min() >= FP32_MIN_COSINE
    with Engine.from_pretrained(gguf_file, pooling="mean", normalize=False) as engine:
        mean = engine.embed(seqs[:2])
    assert (
        cosine(mean, hf_embed_ids(hf_dir, seqs[:2], pooling="mean", normalize=False)).min() >= FP32_MIN_COSINE
    )


def test_eos_is_added_when_the_metadata_asks(gguf_root: Path, tok: HFTokenizer) -> None:
    hf_dir, gguf_file = build_gguf_pair(gguf_root / "eos", "qwen2", tok, add_eos=True)
    eos = tok.token_to_id(EOS)
    with Engine.from_pretrained(gguf_file, max_model_len=8) as engine:
        full = engine.renderer.text(["a b"])[0].token_ids
        cut = engine.renderer.text(["the wing and the slipstream and the flap"], truncate="end")[0].token_ids
        got = engine.embed(["a b"])
    assert full == [*tok.encode("a b").ids, eos]
    assert len(cut) == 8 and cut[-1] == eos  # truncation cuts the text, keeps the EOS
    assert cosine(got, hf_embed_ids(hf_dir, [full]))[0] >= FP32_MIN_COSINE


def _qwen_meta() -> dict[str, object]:
    """llama.cpp's `tokenizer.ggml.*` for the real Qwen tokenizer, from its vocab/merges files."""
    src = qwen_tokenizer_dir()
    vocab = json.loads((src / "vocab.json").read_text())
    added = json.loads((src / "tokenizer.json").read_text())["added_tokens"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    types = [1] * len(tokens)
    for a in sorted(added, key=lambda a: a["id"]):
        assert a["id"] == len(tokens)
        tokens.append(a["content"])
        types.append(3 if a["special"] else 4)
    merges = [m for m in (src / "merges.txt").read_text().splitlines() if m and not m.startswith("#")]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
    }


def test_gguf_tokenizer_rebuilds_the_real_qwen_tokenizer() -> None:
    meta = _qwen_meta()
    ours = gguf_tokenizer(lambda key, default: meta.get(key, default))
    ref = HFTokenizer.from_file(str(qwen_tokenizer_dir() / "tokenizer.json"))
    samples = [
        *TEXTS,
        "def f(x):\n    return x**2  # 12345678 digits\r\n",
        "<|im_start|>user\nHello<|im_end|> <|endoftext|>",
        "emoji 🚀🚀 and tabs\t\tend   ",
        "It's they'RE we'll 'S",
    ]
    for text in samples:
        assert ours.encode(text).ids == ref.encode(text).ids, text
        assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == text


def test_unknown_tokenizer_kinds_are_refused() -> None:
    meta = {**_qwen_meta(), "tokenizer.ggml.pre": "falcon"}
    with pytest.raises(ModelLoadError, match="GGUF pre-tokenizer 'falcon' is not supported; supported: "):
        gguf_tokenizer(lambda key, default: meta.get(key, default))
    with pytest.raises(
        ModelLoadError, match="GGUF tokenizer model 't5' is not supported; supported: 'bert', "
    ):
        gguf_tokenizer(lambda key, default: {"tokenizer.ggml.model": "t5"}.get(key, default))


def _write_header_only(path: Path, arch: str) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_damaged_or_unsupported_gguf_files_are_clear_load_errors(
    gguf_root: Path, tok: HFTokenizer, tmp_path: Path
) -> None:
    with pytest.raises(
        ModelLoadError,
        match="unsupported GGUF architecture 'falcon'; supported: bert, gemma-embedding, llama, "
        "nomic-bert, qwen2, qwen3",
    ):
        Engine.from_pretrained(_write_header_only(tmp_path / "falcon.gguf", "falcon"))
    _, good = build_gguf_pair(gguf_root / "damage", "qwen2", tok)
    data = good.read_bytes()
    for name, content in [
        ("truncated.gguf", data[: len(data) * 2 // 3]),
        ("header.gguf", data[:100]),
        ("garbage.gguf", b"GGUF" + b"\xff" * 200),
        ("notgguf.gguf", b"PK\x03\x04" + data[4:]),
    ]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ModelLoadError, match=f"cannot read GGUF file .*{name}"):
            Engine.from_pretrained(tmp_path / name)
    with pytest.raises(ModelLoadError, match="does not exist"):
        Engine.from_pretrained(tmp_path / "missing.gguf")
