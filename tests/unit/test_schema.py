"""Vector metadata: stable ids that change whenever the vector space changes."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from embedserve import Engine
from embedserve.config import EngineConfig, PoolingConfig, PoolingMethod
from embedserve.errors import ModelLoadError
from embedserve.schema import ModelMetadata, backend_profile, fingerprint_model_dir


def _config(model_dir: Path) -> EngineConfig:
    with Engine.from_pretrained(model_dir) as engine:
        return engine.config


def test_backend_profiles() -> None:
    assert backend_profile(torch.device("cpu"), torch.float32) == "cpu-fp32"
    assert backend_profile(torch.device("cuda", 0), torch.bfloat16) == "cuda-bf16"


def _meta(cfg: EngineConfig, version: str | None = None, fingerprint: str = "f0") -> ModelMetadata:
    return ModelMetadata.from_engine_config(cfg, "m", version, fingerprint)


def test_schema_is_stable_and_changes_with_every_vector_space_choice(qwen3_dir: Path) -> None:
    cfg = _config(qwen3_dir)
    meta = _meta(cfg)
    assert meta.model_version == "f0"  # no label given: the fingerprint is the version
    assert meta.schema() == ModelMetadata.from_engine_config(cfg, "renamed", None, "f0").schema()
    assert meta.schema() == meta.schema(dimensions=cfg.model.hidden_size, normalize=True)
    variants = {
        meta.schema(),
        meta.schema(dimensions=16),
        meta.schema(normalize=False),
        _meta(cfg, version="v2").schema(),
        _meta(cfg, version="f0", fingerprint="f1").schema(),  # same label, other weights
        _meta(dataclasses.replace(cfg, pooling=PoolingConfig(PoolingMethod.MEAN, True))).schema(),
        _meta(dataclasses.replace(cfg, prompts={"query": "Q: "})).schema(),
        _meta(dataclasses.replace(cfg, default_prompt_name="query")).schema(),
    }
    assert len(variants) == 8
    # Numerics are reported beside the schema, not in it.
    bf16 = _meta(dataclasses.replace(cfg, dtype=torch.bfloat16))
    assert bf16.schema() == meta.schema() and bf16.backend_profile == "cpu-bf16"


def test_fingerprint_follows_content_not_location(qwen3_dir: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(qwen3_dir, tmp_path / "copy"))
    assert fingerprint_model_dir(copy) == fingerprint_model_dir(qwen3_dir)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit somewhere in the middle of the weights
    weights.write_bytes(bytes(data))
    assert fingerprint_model_dir(copy) != fingerprint_model_dir(qwen3_dir)
    assert fingerprint_model_dir(weights) != fingerprint_model_dir(qwen3_dir / "model.safetensors")
    with pytest.raises(ModelLoadError, match="no model files"):
        fingerprint_model_dir(tmp_path / "missing")
