"""A PEFT adapter's modules (Hugging Face names, lora/peft_files.py) placed on the engine's own
projections, through the same routes that load the base weights: q_proj, k_proj and v_proj land
in the rows of one fused qkv projection, gate_proj and up_proj in gate|up.

Architectures whose model declares `weight_route` and `shard_sizes` serve adapters (the
decoders of models/decoder.py and the BERT family of models/bert.py); others are refused by name.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from embedserve.errors import ModelLoadError
from embedserve.lora.adapter import Block, LoraAdapter, LoraWeights
from embedserve.lora.peft_files import ModuleUpdate, PeftFiles
from embedserve.models.linear import Linear
from embedserve.models.weights import Route


class Routed(Protocol):
    def weight_route(self, raw_name: str) -> Route | None: ...
    def shard_sizes(self, param: str) -> list[int] | None: ...


def routed(model: nn.Module) -> Routed:
    """The model as adapters see it, or ModelLoadError naming its architecture."""
    if not (hasattr(model, "weight_route") and hasattr(model, "shard_sizes")):
        arch = getattr(getattr(model, "config", None), "architecture", type(model).__name__)
        raise ModelLoadError(
            f"LoRA adapters are served on Qwen3 / Qwen2 / Llama / Mistral decoders and BERT / RoBERTa / "
            f"XLM-R / MPNet encoders; not on {arch}"
        )
    return model  # type: ignore[return-value]


# Modules of a checkpoint an embedding model never runs: BERT's pooler (sentence-transformers pools
# the hidden states itself; a cross-encoder's score head does run it, models/score_head.py).
UNUSED_BY_EMBEDDINGS = ("pooler",)


def place(
    model: nn.Module, files: PeftFiles, unused: tuple[str, ...] = ()
) -> dict[str, list[tuple[slice, ModuleUpdate]]]:
    """Each engine projection an adapter module updates -> (its output rows, the update).
    Modules under an `unused` name (e.g. bert.pooler.dense) are skipped: no vector reads them."""
    routes = routed(model)
    modules = dict(model.named_modules())
    placed: dict[str, list[tuple[slice, ModuleUpdate]]] = {}
    for hf_name, update in files.modules.items():
        if any(part in unused for part in hf_name.split(".")):
            continue
        where = routes.weight_route(f"{hf_name}.weight")
        key = None if where is None else where[0].removesuffix(".weight")
        target = modules.get(key) if key is not None else None
        if where is None or not isinstance(target, Linear):
            raise ModelLoadError(
                f"adapter {files.path}: module {hf_name} is not a linear layer of this model"
            )
        sizes = routes.shard_sizes(where[0])
        shard = where[1]
        lo, n = (
            (0, target.out_features) if shard is None or sizes is None else (sum(sizes[:shard]), sizes[shard])
        )
        if tuple(update.b.shape[:1]) + tuple(update.a.shape[1:]) != (n, target.in_features):
            raise ModelLoadError(
                f"adapter {files.path}: module {hf_name} maps {update.a.shape[1]} -> {update.b.shape[0]} "
                f"features; this model's maps {target.in_features} -> {n} (an adapter of another base model?)"
            )
        assert key is not None
        placed.setdefault(key, []).append((slice(lo, lo + n), update))
    return placed


def build_adapter(
    name: str, files: PeftFiles, model: nn.Module, device: torch.device, unused: tuple[str, ...] = ()
) -> LoraAdapter:
    """The adapter's updates on the engine's projections, fused where the projections are."""
    weights: dict[str, LoraWeights] = {}
    for key, parts in place(model, files, unused).items():
        a = torch.cat([u.a for _, u in parts])  # [R, in]
        blocks, r0 = [], 0
        for rows, u in parts:
            b_t = (u.b * u.scale).t().contiguous().to(device)
            blocks.append(Block(r0, r0 + u.rank, rows.start, rows.stop, b_t))
            r0 += u.rank
        weights[key] = LoraWeights(a.t().contiguous().to(device), tuple(blocks))
    return LoraAdapter(name, str(files.path), files.rank, files.fingerprint, weights)


def merge(model: nn.Module, files: PeftFiles, unused: tuple[str, ...] = ()) -> None:
    """W += scale * B A on every projection the adapter updates (plain weights: before packing),
    summed in float32 and rounded once to the weight's dtype."""
    modules = dict(model.named_modules())
    with torch.no_grad():
        for key, parts in place(model, files, unused).items():
            weight = modules[key].weight
            new = weight.detach().clone()  # never written in place: it may map the checkpoint file
            for rows, u in parts:
                new[rows] = (new[rows].float() + u.scale * (u.b @ u.a).to(new.device)).to(new.dtype)
            weight.data = new
