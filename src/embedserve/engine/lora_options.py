"""The LoRA options of an engine (--enable-lora, --lora-modules, --max-loras, --max-lora-rank,
--merge-lora) resolved into `LoraSettings`, or a ModelLoadError naming what does not combine."""

from __future__ import annotations

from embedserve.engine.options import EngineOptions
from embedserve.errors import ModelLoadError
from embedserve.lora.settings import LoraSettings, parse_modules
from embedserve.models.source import ModelSource


def lora_settings(options: EngineOptions, files: ModelSource) -> LoraSettings | None:
    """None when the engine serves no adapter."""
    o = options
    if not (o.enable_lora or o.lora_modules or o.merge_lora):
        return None
    try:
        modules = parse_modules(o.lora_modules)
    except ValueError as e:
        raise ModelLoadError(str(e)) from None
    if o.merge_lora and len(modules) != 1:
        raise ModelLoadError(
            f"merge_lora merges exactly one --lora-modules adapter into the weights, got {len(modules)}"
        )
    if len(modules) > o.max_loras:
        raise ModelLoadError(f"--lora-modules names {len(modules)} adapters, above --max-loras {o.max_loras}")
    refused = [
        (files.multimodal is not None, "multimodal models"),
        (o.tensor_parallel_size > 1, "tensor_parallel_size > 1 (the ranks load the base weights alone)"),
        (
            o.deterministic and not o.merge_lora,
            "deterministic mode (an adapter's update is summed per batch of its rows); "
            "--merge-lora combines with it",
        ),
        (
            o.compile_backend is not None and not o.merge_lora,
            "compile_backend; --merge-lora combines with it",
        ),
    ]
    for applies, what in refused:
        if applies:
            raise ModelLoadError(f"LoRA adapters are not supported with {what}")
    return LoraSettings(o.max_loras, o.max_lora_rank, modules, o.merge_lora)
