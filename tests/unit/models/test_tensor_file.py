"""models/tensor_file.py reads what safetensors writes: every dtype the loader meets, scalars and
empty tensors, in any order; damaged files are a ModelLoadError naming the file and the tensor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from embedserve.errors import ModelLoadError
from embedserve.models.tensor_file import read_tensors


def test_round_trip_of_every_dtype(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "f32": torch.randn(3, 5, generator=gen),
        "bf16": torch.randn(7, generator=gen).to(torch.bfloat16),
        "f16": torch.randn(2, 2, 2, generator=gen).to(torch.float16),
        "i64": torch.arange(6).reshape(2, 3),
        "i8": torch.tensor([-3, 4], dtype=torch.int8),
        "u8": torch.tensor([250, 3], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "f8": torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn),
    }
    path = tmp_path / "t.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    got = dict(read_tensors(path))
    assert set(got) == set(tensors)
    for name, want in tensors.items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        assert torch.equal(got[name].view(torch.uint8) if name == "f8" else got[name],
                           want.view(torch.uint8) if name == "f8" else want), name  # fmt: skip


def test_damaged_files_name_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    save_file({"a": torch.randn(64), "b": torch.randn(64)}, str(path))
    data = path.read_bytes()
    (tmp_path / "short.safetensors").write_bytes(data[:-10])
    with pytest.raises(ModelLoadError, match=r"short\.safetensors: tensor b"):
        dict(read_tensors(tmp_path / "short.safetensors"))
    (tmp_path / "header.safetensors").write_bytes(data[:20])
    with pytest.raises(ModelLoadError, match=r"cannot read weights from .*header\.safetensors"):
        dict(read_tensors(tmp_path / "header.safetensors"))
    (tmp_path / "empty.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="shorter than its header length"):
        dict(read_tensors(tmp_path / "empty.safetensors"))


def _mapped_files() -> str:
    return Path("/proc/self/maps").read_text()


@pytest.mark.parametrize("model", [pytest.param("qwen3", marks=pytest.mark.slow), "bert"])  # CI time
def test_a_token_table_is_the_files_map_and_the_vectors_do_not_change(
    model: str, qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the size floor lowered to the tiny models' tables: the table parameter is a map of
    the safetensors file (listed in /proc/self/maps while the engine lives), the vectors are
    bit-identical to a load that reads it, and a dtype the file does not hold copies as before."""
    import gc
    import shutil

    import numpy as np

    from embedserve import Engine
    from embedserve.models import tensor_file
    from tests.helpers.tiny_bert import minilm_dir

    src = qwen3_dir if model == "qwen3" else minilm_dir()
    root = shutil.copytree(src, tmp_path / model)  # a path of its own: its map is this test's
    weights = str(root / "model.safetensors")
    texts = ["a token table read from disk row by row", "Zürich", "x " * 40]
    with Engine.from_pretrained(root) as engine:
        read = engine.embed(texts)
    gc.collect()
    assert weights not in _mapped_files()
    monkeypatch.setattr(tensor_file, "_MAP_MIN_BYTES", 0)
    with Engine.from_pretrained(root) as engine:
        assert weights in _mapped_files()
        assert np.array_equal(engine.embed(texts), read)
    del engine
    gc.collect()
    assert weights not in _mapped_files()
    with Engine.from_pretrained(root, dtype="bfloat16") as engine:  # the file holds float32: copied
        gc.collect()
        assert weights not in _mapped_files()
        assert np.allclose(engine.embed(texts), read, atol=0.05)
