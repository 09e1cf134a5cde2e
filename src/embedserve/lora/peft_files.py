"""A PEFT LoRA adapter directory read and checked: `adapter_config.json` and
`adapter_model.safetensors`, as `PeftModel.save_pretrained` writes them.

Each targeted module's update is `B A x * scale`, with scale = lora_alpha / r (lora_alpha /
sqrt(r) with `use_rslora`), r and alpha per module where `rank_pattern` / `alpha_pattern` say
so. What PEFT can train but this server does not apply is refused by name, never dropped:
DoRA, trained biases, embedding or other non-linear targets, `modules_to_save`, ...
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from embedserve.errors import ModelLoadError

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."
# Initialisations that train the adapter on a changed base (its residual), unless converted.
_RESIDUAL_INITS = ("pissa", "olora", "corda", "loftq", "eva")
# <module>.lora_A.weight, or <module>.lora_A.<adapter name>.weight
_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<side>A|B)(?:\.[^.]+)?\.weight$")
# Options PEFT trains that change what the adapter computes: (key, the value that is harmless).
_UNSUPPORTED: tuple[tuple[str, Any, str], ...] = (
    ("use_dora", False, "DoRA (use_dora) adapters"),
    ("fan_in_fan_out", False, "fan_in_fan_out (Conv1D) layers"),
    ("lora_bias", False, "trained LoRA biases (lora_bias)"),
    ("layer_replication", None, "layer_replication"),
    ("target_parameters", None, "target_parameters (LoRA on parameters, not modules)"),
    ("trainable_token_indices", None, "trainable_token_indices"),
    ("use_qalora", False, "QALoRA"),
)


@dataclass(frozen=True)
class ModuleUpdate:
    """One targeted module's low-rank update, in float32: delta W = scale * B @ A."""

    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scale: float

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass(frozen=True)
class PeftFiles:
    path: Path
    modules: dict[str, ModuleUpdate]  # the module's name in the base model (Hugging Face's)
    fingerprint: str  # sha256 of the config and weights files

    @property
    def rank(self) -> int:
        return max(m.rank for m in self.modules.values())


def read_peft(path: str | Path, max_rank: int) -> PeftFiles:
    """The adapter at `path`; ModelLoadError naming what is missing, malformed or unsupported."""
    root = Path(path)
    if not (root / CONFIG).is_file():
        raise ModelLoadError(f"no PEFT adapter at {root}: {CONFIG} is missing")
    if not (root / WEIGHTS).is_file():
        other = (
            " (adapter_model.bin: save it with safe_serialization=True)"
            if (root / "adapter_model.bin").is_file()
            else ""
        )
        raise ModelLoadError(f"no {WEIGHTS} in {root}{other}")
    try:
        config = json.loads((root / CONFIG).read_text())
        tensors = load_file(str(root / WEIGHTS))
    except Exception as e:  # safetensors' own error is neither OSError nor ValueError
        raise ModelLoadError(f"cannot read the adapter at {root}: {type(e).__name__}: {e}") from None
    _check_config(config, root)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise ModelLoadError(f"adapter {root}: tensor {key!r} is not a LoRA A/B weight of a linear layer")
        module = m["module"].removeprefix(_PREFIX)
        pairs.setdefault(module, {})[m["side"]] = tensor.float()
    if not pairs:
        raise ModelLoadError(f"adapter {root} holds no LoRA weights")
    modules = {name: _update(name, sides, config, root) for name, sides in sorted(pairs.items())}
    rank = max(m.rank for m in modules.values())
    if rank > max_rank:
        raise ModelLoadError(f"adapter {root} has rank {rank}, above --max-lora-rank {max_rank}")
    digest = hashlib.sha256()
    for name in (CONFIG, WEIGHTS):
        digest.update((root / name).read_bytes())
    return PeftFiles(root, modules, digest.hexdigest()[:16])


def _check_config(config: Any, root: Path) -> None:
    if not isinstance(config, dict):
        raise ModelLoadError(f"adapter {root}: {CONFIG} is not a JSON object")
    kind = config.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise ModelLoadError(f"adapter {root} is a {kind} adapter; only LoRA adapters are served")
    for key, harmless, what in _UNSUPPORTED:
        value = config.get(key, harmless)
        if value not in (harmless, None, False, [], {}):
            raise ModelLoadError(f"adapter {root}: {what} are not supported")
    init = config.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower().startswith(_RESIDUAL_INITS):
        raise ModelLoadError(
            f"adapter {root}: init_lora_weights {init!r} changes the base weights it was trained on; "
            "convert it to a plain LoRA (PEFT's path_initial_model_for_weight_conversion) to serve it"
        )
    if config.get("bias", "none") != "none":
        raise ModelLoadError(f"adapter {root}: trained biases (bias={config['bias']!r}) are not supported")
    if config.get("modules_to_save"):
        raise ModelLoadError(
            f"adapter {root}: modules_to_save {config['modules_to_save']} (fully trained modules) are not "
            "supported; only low-rank updates of linear layers"
        )


def _update(name: str, sides: dict[str, torch.Tensor], config: dict[str, Any], root: Path) -> ModuleUpdate:
    if set(sides) != {"A", "B"}:
        missing = "lora_B" if "A" in sides else "lora_A"
        raise ModelLoadError(f"adapter {root}: module {name} has no {missing} weight")
    a, b = sides["A"], sides["B"]
    if a.dim() != 2 or b.dim() != 2 or b.shape[1] != a.shape[0]:
        raise ModelLoadError(
            f"adapter {root}: module {name} has lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)}, "
            "not [r, in] and [out, r]"
        )
    r = a.shape[0]
    alpha = float(_pattern(config.get("alpha_pattern") or {}, name, config.get("lora_alpha", 8)))
    scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    return ModuleUpdate(a, b, scale)


def _pattern(patterns: dict[str, Any], module: str, default: Any) -> Any:
    """PEFT's per-module override: the module's own name, else the first pattern that ends its
    dotted name."""
    if module in patterns:
        return patterns[module]
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default
