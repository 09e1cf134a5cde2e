"""ModernBERT (gte-modernbert's, modernbert-embed's architecture): engine vs transformers'
ModernBertModel (through sentence-transformers) on a tiny random-weight model whose local
window is narrower than the inputs. No real weights are at hand: these are its proof."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve import Engine
from tests.helpers.engine_calls import embed_multivector
from tests.helpers.reference import cosine, st_embed
from tests.helpers.tiny_bert import TOKENIZER_FILES, minilm_dir
from tests.helpers.tiny_models import scale_weights, write_st_files

SENTENCE = "the lift of a wing in a propeller slipstream was measured at several angles of attack"


def texts(counts: list[int]) -> list[str]:
    words = SENTENCE.split()
    return [" ".join(words[i % len(words)] for i in range(n)) for n in counts]


def build_modernbert(dst: Path, pooling: str = "mean", masked_lm: bool = True) -> Path:
    import transformers

    config = transformers.ModernBertConfig(
        vocab_size=30522, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, max_position_embeddings=1024, local_attention=16,
        global_attn_every_n_layers=3, global_rope_theta=160000.0, local_rope_theta=10000.0,
        pad_token_id=0, bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102,
    )  # fmt: skip
    model = transformers.ModernBertForMaskedLM(config) if masked_lm else transformers.ModernBertModel(config)
    scale_weights(model, 0.3, seed=11)
    model.save_pretrained(dst, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, dst / name)
    write_st_files(dst, 64, pooling, True, {"query": "search_query: "}, 1024)
    return dst


@pytest.fixture(scope="module")
def modernbert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_modernbert(tmp_path_factory.mktemp("mb") / "m")


def test_modernbert_matches_sentence_transformers(modernbert_dir: Path) -> None:
    batch = texts([1, 3, 8, 9, 30, 120, 600, 6])
    ref = st_embed(modernbert_dir, batch, batch_size=3, prompt_name="query")
    with Engine.from_pretrained(modernbert_dir) as engine:
        cfg = engine.config.model
        assert cfg.layer_windows == (0, 9, 9, 0) and not cfg.norm_bias
        got = engine.embed(batch, prompt_name="query")
        alone = engine.embed(batch[6:7], prompt_name="query")[0]
    assert cosine(got, ref).min() >= 0.99999
    assert np.array_equal(alone, got[6])


def test_cls_pooling_of_the_base_model_and_the_local_window_matters(tmp_path: Path) -> None:
    d = build_modernbert(tmp_path / "cls", pooling="cls", masked_lm=False)
    batch = texts([40, 300])
    ref = st_embed(d, batch)
    with Engine.from_pretrained(d) as engine:
        assert cosine(engine.embed(batch), ref).min() >= 0.99999
    cfg = json.loads((d / "config.json").read_text())
    cfg["layer_types"] = ["full_attention"] * 4
    (d / "config.json").write_text(json.dumps(cfg))
    with Engine.from_pretrained(d) as engine:
        assert cosine(engine.embed(batch), ref).max() < 0.999


def test_a_legacy_rope_scaling_is_refused(modernbert_dir: Path, tmp_path: Path) -> None:
    from embedserve.errors import ModelLoadError

    d = Path(shutil.copytree(modernbert_dir, tmp_path / "scaled"))
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(
        json.dumps({**cfg, "rope_scaling": {"rope_type": "linear", "factor": 4.0}})
    )
    with pytest.raises(ModelLoadError, match=r"ModernBERT rope_scaling .* is not implemented"):
        Engine.from_pretrained(d)


def test_a_modernbert_colbert_with_unattended_query_expansion(modernbert_dir: Path, tmp_path: Path) -> None:
    """GTE-ModernColBERT's shape: the expansion positions of a query are queries only, never keys,
    in the local layers' bands too (attention/windowed.py), as sentence-transformers computes them."""
    import string

    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Transformer
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    expansion = {"strategy": "fixed", "attend": False, "length": 32}
    dense = Dense(
        64, 24, bias=False, activation_function=torch.nn.Identity(),
        module_input_name="token_embeddings", module_output_name="token_embeddings",
    )  # fmt: skip
    with torch.no_grad():
        dense.linear.weight.copy_(torch.randn(24, 64, generator=torch.Generator().manual_seed(3)) / 8)
    model = MultiVectorEncoder(
        modules=[
            Transformer(str(modernbert_dir), query_expansion=expansion, document_length=300), dense,
            MultiVectorMask(skiplist_words=list(string.punctuation)),
            Normalize(module_input_name="token_embeddings"),
        ],
        device="cpu",
    )  # fmt: skip
    model.save(str(tmp_path / "colbert"))
    ref = MultiVectorEncoder(str(tmp_path / "colbert"), device="cpu")
    queries, docs = texts([25, 27]), texts([40, 250])  # 27-29 tokens: a few expansion positions
    want = [v.numpy() for v in ref.encode_query(queries)] + [v.numpy() for v in ref.encode_document(docs)]
    with Engine.from_pretrained(tmp_path / "colbert") as engine:
        got = embed_multivector(engine, queries, input_type="query") + embed_multivector(engine, docs)
    assert [g.shape for g in got] == [w.shape for w in want] and got[0].shape[0] == 32
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
