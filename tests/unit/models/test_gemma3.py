"""Gemma3 text models (EmbeddingGemma's architecture): engine vs sentence-transformers on tiny
random-weight models, bidirectional and causal, with windows narrower than the inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve import Engine
from embedserve.attention.windowed import sequence_attention
from embedserve.errors import ModelLoadError
from tests.helpers.engine_calls import embed_late, embed_outputs
from tests.helpers.reference import cosine, st_embed, st_model
from tests.helpers.tiny_gemma import build_gemma3

FP32_MIN_COSINE = 0.99999
SENTENCE = "the lift of a wing in a propeller slipstream was measured at several angles of attack"
# 1 .. 400 words: the band (|q - k| <= 8 here) is far narrower than most of them
COUNTS = [1, 2, 5, 9, 17, 40, 120, 400, 3, 70]


def texts(counts: list[int]) -> list[str]:
    words = SENTENCE.split()
    return [" ".join(words[i % len(words)] for i in range(n)) for n in counts]


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_gemma3(tmp_path_factory.mktemp("gemma") / "bi")


@pytest.fixture(scope="module")
def causal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("gemma") / "causal"
    return build_gemma3(d, bidirectional=False, window=24, dense=(), pooling="lasttoken", seed=1)


@pytest.mark.parametrize("prompt_name", ["query", "document"])
def test_bidirectional_gemma3_matches_sentence_transformers(gemma_dir: Path, prompt_name: str) -> None:
    batch = texts(COUNTS)
    ref = st_embed(gemma_dir, batch, prompt_name=prompt_name, batch_size=4)  # padded batches
    with Engine.from_pretrained(gemma_dir, max_num_batched_tokens=1024) as engine:
        cfg = engine.config.model
        assert cfg.layer_windows == (9, 0, 9, 9) and not cfg.causal_mask and not cfg.is_causal
        got = np.stack([o.embedding for o in embed_outputs(engine, batch, prompt_name=prompt_name)])
        alone = engine.embed(batch[7:8], prompt_name=prompt_name)[0]
    assert got.shape == ref.shape == (len(batch), 96)
    assert cosine(got, ref).min() >= FP32_MIN_COSINE
    assert np.abs(np.linalg.norm(got, axis=1) - 1).max() < 1e-5
    assert np.array_equal(alone, got[7])  # alone == in a batch, bit for bit


def test_the_windows_and_the_dense_modules_matter(gemma_dir: Path, tmp_path: Path) -> None:
    """The same weights with every layer full, or without the Dense modules, give other vectors:
    the fixture exercises both."""
    batch = texts([400, 120])
    ref = st_embed(gemma_dir, batch)
    full = Path(shutil.copytree(gemma_dir, tmp_path / "full"))
    config = json.loads((full / "config.json").read_text())
    config["layer_types"] = ["full_attention"] * len(config["layer_types"])
    (full / "config.json").write_text(json.dumps(config))
    with Engine.from_pretrained(full) as engine:
        assert cosine(engine.embed(batch), ref).max() < 0.999
    no_dense = Path(shutil.copytree(gemma_dir, tmp_path / "no_dense"))
    modules = json.loads((no_dense / "modules.json").read_text())
    (no_dense / "modules.json").write_text(json.dumps([m for m in modules if "Dense" not in m["type"]]))
    with Engine.from_pretrained(no_dense) as engine:
        assert cosine(engine.embed(batch), ref).max() < 0.999


def test_causal_gemma3_matches_sentence_transformers(causal_dir: Path) -> None:
    batch = texts(COUNTS)
    ref = st_embed(causal_dir, batch, batch_size=3)
    with Engine.from_pretrained(causal_dir) as engine:
        assert engine.config.model.causal_mask and engine.config.model.layer_windows[0] == 24
        got = engine.embed(batch)
    assert cosine(got, ref).min() >= FP32_MIN_COSINE


def test_causal_gemma3_without_sentence_transformers_files_reads_the_last_token(
    causal_dir: Path, tmp_path: Path
) -> None:
    d = Path(shutil.copytree(causal_dir, tmp_path / "bare"))
    (d / "modules.json").unlink()
    with Engine.from_pretrained(d) as engine:
        assert engine.config.pooling.method.value == "lasttoken"


def test_bf16_vectors_stay_close(gemma_dir: Path) -> None:
    batch = texts(COUNTS)
    ref = st_embed(gemma_dir, batch, prompt_name="query")
    with Engine.from_pretrained(gemma_dir, dtype="bfloat16") as engine:
        got = engine.embed(batch, prompt_name="query")
    assert np.quantile(cosine(got, ref), 0.01) >= 0.99  # tiny random weights: looser than real ones


@pytest.mark.parametrize("dims", [96, 64, 32, 8])
def test_matryoshka_dimensions_slice_after_the_dense_modules(gemma_dir: Path, dims: int) -> None:
    batch = texts([3, 60, 400])
    ref = st_model(str(gemma_dir)).encode(batch, truncate_dim=dims, prompt_name="query")
    with Engine.from_pretrained(gemma_dir) as engine:
        got = engine.embed(batch, dimensions=dims, prompt_name="query")
    assert got.shape == (3, dims)
    assert cosine(got, np.asarray(ref)).min() >= FP32_MIN_COSINE
    assert np.abs(np.linalg.norm(got, axis=1) - 1).max() < 1e-5  # sliced, then normalized


def test_a_dense_chain_that_changes_the_width(tmp_path: Path) -> None:
    d = build_gemma3(tmp_path / "narrow", dense=(128, 48), dense_bias=True,
                     activation="torch.nn.modules.activation.Tanh", seed=3)  # fmt: skip
    batch = texts([5, 80])
    ref = st_embed(d, batch)
    with Engine.from_pretrained(d) as engine:
        got = engine.embed(batch)
        assert got.shape == (2, 48)
        with pytest.raises(Exception, match=r"dimensions must be an integer in \[1, 48\]"):
            engine.embed(batch, dimensions=96)
    assert cosine(got, ref).min() >= FP32_MIN_COSINE


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"activation_function": "torch.nn.modules.activation.Softplus"}, "activation .*Softplus"),
        ({"use_residual": True}, "use_residual is not supported"),
        ({"in_features": 7}, "in_features 7 / out_features 384 do not follow a 96-wide vector"),
        ({"module_input_name": "token_embeddings"}, "reads 'token_embeddings' and writes 'token_embeddings'"),
        (
            {"module_output_name": "token_embeddings"},
            "reads 'sentence_embedding' and writes 'token_embeddings'",
        ),
    ],
)
def test_dense_modules_we_cannot_follow_are_refused_by_name(
    gemma_dir: Path, tmp_path: Path, change: dict[str, object], message: str
) -> None:
    d = Path(shutil.copytree(gemma_dir, tmp_path / "bad"))
    cfg_file = d / "2_Dense" / "config.json"
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()), **change}))
    with pytest.raises(ModelLoadError, match=message):
        Engine.from_pretrained(d)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 7, 130, 301, 700])
def test_banded_attention_equals_the_masked_full_product(causal: bool, n: int) -> None:
    """O(n * w) blocks == SDPA over all keys with transformers' band mask."""
    gen = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(n, h, 16, generator=gen) for h in (4, 2, 2))
    window = 33
    pos = torch.arange(n)
    dist = pos[:, None] - pos[None, :]
    mask = ((dist >= 0) & (dist < window)) if causal else dist.abs() < window
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=mask, scale=0.2, enable_gqa=True,
    )[0].transpose(0, 1).flatten(1)  # fmt: skip
    got = sequence_attention(q, k, v, 0.2, window, causal)
    assert torch.allclose(got, ref, atol=1e-5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"max_num_batched_tokens": 64},
            r"cannot be chunked: max_num_batched_tokens \(64\) must be >= max_model_len",
        ),
        ({"layer_major_tokens": 100}, "layer_major_tokens applies to decoder models only"),
        ({"kv_cache_memory": 1 << 20}, "kv_cache_memory does not apply"),
        ({"enable_prefix_caching": True}, "enable_prefix_caching needs a decoder"),
        ({"tensor_parallel_size": 2}, r"Gemma3TextModel runs every input whole \(no KV cache to split\)"),
    ],
)
def test_what_a_whole_input_model_cannot_do_is_refused_by_name(
    causal_dir: Path, options: dict[str, object], message: str
) -> None:
    """A causal Gemma3 runs whole inputs too (docs/models.md): no chunks, no cache to share."""
    with pytest.raises(ModelLoadError, match=message):
        Engine.from_pretrained(causal_dir, **options)


def test_late_chunks_of_a_dense_head_model(gemma_dir: Path) -> None:
    """Each chunk's pooled rows pass the Dense modules (96 wide, normalized); a document over one
    window is refused: its windows' rows would pass them before being joined."""
    with Engine.from_pretrained(gemma_dir, max_model_len=128, max_num_batched_tokens=512) as engine:
        out = embed_late(engine, ["alpha beta gamma", "delta epsilon"])
        assert out.embeddings.shape == (2, 96)
        assert np.abs(np.linalg.norm(out.embeddings, axis=1) - 1).max() < 1e-5
        with pytest.raises(
            Exception, match="Dense modules after pooling: late chunking takes documents of one"
        ):
            embed_late(engine, " ".join(["word"] * 400), chunk_size=50, long=True)


def test_a_dense_config_naming_no_activation_is_tanh_as_sentence_transformers(
    gemma_dir: Path, tmp_path: Path
) -> None:
    d = Path(shutil.copytree(gemma_dir, tmp_path / "noact"))
    cfg_file = d / "2_Dense" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    del cfg["activation_function"]
    cfg_file.write_text(json.dumps(cfg))
    batch = texts([4, 60])
    ref = st_embed(d, batch)
    with Engine.from_pretrained(d) as engine:
        assert engine.config.pooling.dense[0].activation == "tanh"
        assert cosine(engine.embed(batch), ref).min() >= FP32_MIN_COSINE
