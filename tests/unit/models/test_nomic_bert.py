"""NomicBert (nomic-embed-text's architecture): engine vs transformers' NomicBertModel (through
sentence-transformers) on a tiny random-weight model, in transformers' and nomic's own spellings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from embedserve import Engine
from embedserve.errors import ModelLoadError
from tests.helpers.reference import cosine, st_embed
from tests.helpers.tiny_bert import build_nomic

SENTENCE = "the lift of a wing in a propeller slipstream was measured at several angles of attack"
PROMPTS = {"query": "search_query: ", "document": "search_document: "}


def texts(counts: list[int]) -> list[str]:
    words = SENTENCE.split()
    return [" ".join(words[i % len(words)] for i in range(n)) for n in counts]


@pytest.fixture(scope="module")
def nomic_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_nomic(tmp_path_factory.mktemp("nomic") / "n", prompts=PROMPTS)


def other_spelling(src: Path, dst: Path) -> Path:
    """transformers saves nomic's own weight names (emb_ln, encoder.layers.N.attn.Wqkv, fc11 /
    fc12 / fc2, norm1 / norm2) beside its own config keys; this writes the other pair: its
    NomicBertModel's weight names and nomic's config keys."""
    shutil.copytree(src, dst)
    state = load_file(str(src / "model.safetensors"))
    assert "encoder.layers.0.attn.Wqkv.weight" in state  # nomic's names, as saved
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if ".attn.Wqkv." in name:
            for x, rows in zip("qkv", t.chunk(3), strict=True):
                out[name.replace("attn.Wqkv", f"self_attn.{x}_proj").removeprefix("encoder.")] = rows
            continue
        name = name.replace("emb_ln", "embeddings.LayerNorm").removeprefix("encoder.")
        for a, b in (("attn.out_proj", "self_attn.o_proj"), ("mlp.fc11", "mlp.up_proj"),
                     ("mlp.fc12", "mlp.gate_proj"), ("mlp.fc2", "mlp.down_proj"),
                     ("norm1", "post_attention_layernorm"), ("norm2", "post_mlp_layernorm")):  # fmt: skip
            name = name.replace(a, b)
        out[name] = t
    save_file(out, str(dst / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    nomic = {"architectures": ["NomicBertModel"], "model_type": "nomic_bert", "vocab_size": 30522,
             "n_embd": 64, "n_head": 4, "n_layer": 2, "n_inner": 96, "n_positions": 1024,
             "rotary_emb_base": cfg["rope_parameters"]["rope_theta"], "rotary_emb_fraction": 1.0,
             "activation_function": "swiglu", "layer_norm_epsilon": cfg["layer_norm_eps"], "prenorm": False,
             "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False,
             "rotary_scaling_factor": None, "type_vocab_size": 2, "max_trained_positions": 512}  # fmt: skip
    (dst / "config.json").write_text(json.dumps(nomic))
    return dst


@pytest.mark.parametrize("prompt_name", ["query", "document"])
def test_nomic_bert_matches_sentence_transformers(nomic_dir: Path, prompt_name: str) -> None:
    batch = texts([1, 3, 12, 50, 200, 700, 5])
    ref = st_embed(nomic_dir, batch, prompt_name=prompt_name, batch_size=3)
    with Engine.from_pretrained(nomic_dir) as engine:
        assert engine.config.model.rope_theta == 1000.0
        got = engine.embed(batch, prompt_name=prompt_name)
    assert cosine(got, ref).min() >= 0.99999


def test_both_spellings_load_the_same_model(nomic_dir: Path, tmp_path: Path) -> None:
    """...and nomic's max_trained_positions is the length limit (its n_positions is not)."""
    batch = texts([4, 90, 300])
    with Engine.from_pretrained(nomic_dir) as engine:
        want = engine.embed(batch)
    with Engine.from_pretrained(other_spelling(nomic_dir, tmp_path / "own")) as engine:
        got = engine.embed(batch)
        assert engine.config.scheduler.max_model_len == 512
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("rotary_scaling_factor", 2.0, "rotary_scaling_factor=2.0 is not implemented"),
        ("rotary_scaling_factor", 1.0, "rotary_scaling_factor=1.0 is not implemented"),  # NTK past 2,048
        ("rotary_emb_scale_base", 512, "rotary_emb_scale_base=512"),
        ("rotary_emb_fraction", 0.5, "rotary_emb_fraction=0.5"),
        ("prenorm", True, "prenorm=True"),
        ("activation_function", "gelu", "activation 'gelu'; only swiglu"),
    ],
)
def test_what_nomics_code_can_do_and_we_do_not_is_refused(
    nomic_dir: Path, tmp_path: Path, key: str, value: object, message: str
) -> None:
    d = other_spelling(nomic_dir, tmp_path / "own")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, key: value}))
    with pytest.raises(ModelLoadError, match=message):
        Engine.from_pretrained(d)
