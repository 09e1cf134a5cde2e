"""Model directories: sharded weights, name prefixes, sentence-transformers files, refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from embedserve import Engine
from embedserve.config import PoolingMethod
from embedserve.errors import ModelLoadError
from embedserve.models.loader import read_model_dir
from tests.helpers.reference import cosine, hf_embed_ids, random_ids
from tests.helpers.tiny_models import build_decoder


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_sharded_weights_with_index_load(qwen3_dir: Path, tmp_path: Path) -> None:
    d = _copy(qwen3_dir, tmp_path / "sharded")
    tensors = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    weight_map = {}
    for shard, keys in shards.items():
        # Checkpoints saved from *ForCausalLM carry a "model." prefix: mix both styles.
        save_file({f"model.{k}": tensors[k] for k in keys}, str(d / shard))
        weight_map.update({f"model.{k}": shard for k in keys})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    seqs = [random_ids(300, seed=4)]
    with Engine.from_pretrained(d) as engine:
        assert cosine(engine.embed(seqs), hf_embed_ids(qwen3_dir, seqs))[0] >= 0.99999


def test_sentence_transformers_files_are_read(qwen3_dir: Path, qwen2_dir: Path, mistral_dir: Path) -> None:
    q3 = read_model_dir(qwen3_dir)
    assert q3.pooling.method is PoolingMethod.LAST and q3.pooling.normalize
    assert q3.prompts["query"].endswith("\nQuery:") and q3.model.head_dim == 32
    assert read_model_dir(qwen2_dir).pooling.method is PoolingMethod.MEAN
    assert read_model_dir(qwen2_dir).model.qkv_bias and not read_model_dir(qwen2_dir).model.qk_norm
    # No sentence-transformers files: decoder default is last-token + normalize, overridable.
    m = read_model_dir(mistral_dir)
    assert m.pooling.method is PoolingMethod.LAST and m.pooling.normalize
    assert read_model_dir(mistral_dir, pooling="mean").pooling.method is PoolingMethod.MEAN


def test_new_style_pooling_config_is_read(qwen3_dir: Path, tmp_path: Path) -> None:
    d = _copy(qwen3_dir, tmp_path / "st6")
    (d / "1_Pooling" / "config.json").write_text(
        json.dumps({"embedding_dimension": 64, "pooling_mode": "mean"})
    )
    assert read_model_dir(d).pooling.method is PoolingMethod.MEAN


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"},
            "unsupported architecture GPT2LMHeadModel; supported: ",
        ),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "RoPE scaling 'yarn'"),
        ({"hidden_act": "gelu"}, "unsupported activation 'gelu'"),
    ],
)
def test_unsupported_configs_are_refused(qwen3_dir: Path, tmp_path: Path, edit: dict, match: str) -> None:
    d = _copy(qwen3_dir, tmp_path / "bad")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(edit)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=match):
        Engine.from_pretrained(d)


def test_unsupported_st_module_and_missing_files_are_refused(qwen3_dir: Path, tmp_path: Path) -> None:
    d = _copy(qwen3_dir, tmp_path / "dense")
    modules = json.loads((d / "modules.json").read_text())
    # Dense modules are read (tests/unit/models/test_gemma3.py); after Normalize they are refused
    dense = {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    (d / "modules.json").write_text(json.dumps([*modules, dense]))
    with pytest.raises(ModelLoadError, match="a Dense module after Normalize is not supported"):
        read_model_dir(d)
    lstm = {**dense, "path": "3_LSTM", "type": "sentence_transformers.models.LSTM"}
    (d / "modules.json").write_text(json.dumps([*modules, lstm]))
    with pytest.raises(ModelLoadError, match=r"models\.LSTM' is not supported"):
        read_model_dir(d)
    (d / "model.safetensors").unlink()
    (d / "modules.json").unlink()
    with pytest.raises(ModelLoadError, match=r"no model\.safetensors"):
        read_model_dir(d)
    with pytest.raises(ModelLoadError, match="not a directory"):
        read_model_dir(tmp_path / "missing")


def test_weights_that_do_not_fit_are_refused(qwen3_dir: Path, tmp_path: Path) -> None:
    d = _copy(qwen3_dir, tmp_path / "shape")
    tensors = load_file(d / "model.safetensors")
    tensors["layers.0.mlp.down_proj.weight"] = torch.zeros(3, 3)
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="has shape \\(3, 3\\)"):
        Engine.from_pretrained(d)
    del tensors["layers.0.mlp.down_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(
        ModelLoadError, match=r"missing from the Qwen3Model checkpoint: layers\.0\.mlp\.down_proj\.weight"
    ):
        Engine.from_pretrained(d)


def test_sliding_window_is_refused_beyond_the_window(tmp_path: Path) -> None:
    d = build_decoder(tmp_path / "mistral-sw", "mistral", extra={"sliding_window": 256}, st_files=False)
    with Engine.from_pretrained(d) as engine:  # inputs capped at the window: full attention is exact
        assert engine.config.scheduler.max_model_len == 256
    with pytest.raises(ModelLoadError, match="exceeds the sliding window \\(256\\)"):
        Engine.from_pretrained(d, max_model_len=1024)
