"""sentence-transformers modules after pooling: `Dense` chains and which features `Normalize` reads.

Each module reads one entry of sentence-transformers' features dict, its `module_input_name`
(default "sentence_embedding", the pooled vector) and writes `module_output_name`: a Normalize
of "token_embeddings" leaves the pooled vector as it is, and one of "sentence_embedding" leaves
token vectors (a multi-vector model's) as they are. The modules are followed by those names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from embedserve.config import DenseLayer
from embedserve.errors import ModelLoadError

SENTENCE, TOKENS = "sentence_embedding", "token_embeddings"
# sentence-transformers' saved activation class -> the name pooling/dense.py applies
ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
}


def read_json(path: Path) -> Any:
    """A model directory's JSON file; ModelLoadError naming it when it cannot be read."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from e


def module_config(root: Path, module: dict[str, Any]) -> dict[str, Any]:
    """A module's folder's config.json ({} where it has none, as for a plain Normalize)."""
    path = root / str(module.get("path", "")) / "config.json"
    if not str(module.get("path", "")) or not path.is_file():
        return {}
    cfg = read_json(path)
    return cfg if isinstance(cfg, dict) else {}


def input_name(cfg: dict[str, Any]) -> str:
    return str(cfg.get("module_input_name") or SENTENCE)


def read_dense(root: Path, module: dict[str, Any], in_features: int) -> DenseLayer:
    """A sentence-level Dense module, checked against the width before it."""
    folder = root / str(module.get("path", ""))
    cfg = module_config(root, module)
    name = f"Dense module {folder.name!r}"
    output = str(cfg.get("module_output_name") or input_name(cfg))
    if input_name(cfg) != SENTENCE or output != SENTENCE:
        raise ModelLoadError(
            f"{name} reads {input_name(cfg)!r} and writes {output!r}: only a Dense of the pooled vector "
            f"({SENTENCE!r}) is served"
        )
    if cfg.get("use_residual"):
        raise ModelLoadError(f"{name}: use_residual is not supported")
    # sentence-transformers' Dense defaults to Tanh when its config names none
    activation = str(cfg.get("activation_function") or "torch.nn.modules.activation.Tanh")
    if activation not in ACTIVATIONS:
        raise ModelLoadError(
            f"{name}: activation {activation} is not supported; supported: {', '.join(sorted(ACTIVATIONS))}"
        )
    if cfg.get("in_features") != in_features or not isinstance(cfg.get("out_features"), int):
        raise ModelLoadError(
            f"{name}: in_features {cfg.get('in_features')} / out_features {cfg.get('out_features')} "
            f"do not follow a {in_features}-wide vector"
        )
    if not any((folder / f).is_file() for f in ("model.safetensors", "pytorch_model.bin")):
        raise ModelLoadError(f"{name}: no model.safetensors or pytorch_model.bin in {folder}")
    return DenseLayer(str(folder), in_features, int(cfg["out_features"]), bool(cfg.get("bias", True)),
                      ACTIVATIONS[activation])  # fmt: skip
