"""The default model: hash-verified all-MiniLM-L6-v2, the CLI's --model default."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pytest

from embedserve.engine.options import add_engine_options
from embedserve.errors import ModelLoadError
from embedserve.models import default_model_path
from embedserve.models.default import DEFAULT_MODEL_NAME, WEIGHTS_SHA256, verified_model_dir
from tests.helpers.tiny_bert import minilm_dir


def test_default_model_is_the_verified_package_copy() -> None:
    path = default_model_path()
    assert path == minilm_dir()
    assert hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest() == WEIGHTS_SHA256


def test_weights_with_another_hash_are_refused(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"not the published weights")
    with pytest.raises(
        ModelLoadError, match=r"refusing the default model: .* has sha256 [0-9a-f]{64}, expected"
    ):
        verified_model_dir(tmp_path)
    with pytest.raises(ModelLoadError, match="is missing"):
        verified_model_dir(tmp_path / "nowhere")


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    return parser.parse_args(argv)


def test_cli_model_defaults_to_the_verified_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _parse([]).model == str(minilm_dir())
    assert _parse(["--model", str(tmp_path)]).model == str(tmp_path)
    # A local directory that happens to carry the default's name is the user's, not ours.
    monkeypatch.chdir(tmp_path)
    (tmp_path / DEFAULT_MODEL_NAME).mkdir()
    assert _parse([]).model == DEFAULT_MODEL_NAME


def test_cli_refuses_a_tampered_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def tampered() -> Path:
        raise ModelLoadError("refusing the default model: bad hash")

    monkeypatch.setattr("embedserve.models.default.default_model_path", tampered)
    with pytest.raises(SystemExit) as exit_info:
        _parse([])
    assert exit_info.value.code == 2
    assert "argument --model: refusing the default model: bad hash" in capsys.readouterr().err


def test_bench_and_parity_specs_take_the_default_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from embedserve.bench.target import parse_target
    from embedserve.errors import InvalidInputError
    from embedserve.parity.backends import open_backend
    from embedserve.parity.options import ParityError

    spec = parse_target(f"sentence-transformers:{DEFAULT_MODEL_NAME}?dtype=float32")
    assert (spec.location, spec.name) == (str(minilm_dir()), f"st:{DEFAULT_MODEL_NAME}:float32")

    def tampered() -> Path:
        raise ModelLoadError("refusing the default model: bad hash")

    monkeypatch.setattr("embedserve.models.default.default_model_path", tampered)
    with pytest.raises(InvalidInputError, match="refusing the default model: bad hash"):
        parse_target(f"engine:{DEFAULT_MODEL_NAME}")
    with pytest.raises(ParityError, match="refusing the default model: bad hash"):
        open_backend(f"engine:{DEFAULT_MODEL_NAME}")
