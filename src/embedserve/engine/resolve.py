"""Stage one of building an engine: options + the model's files -> EngineConfig, without weights.

Everything that can refuse a configuration refuses here, before any weight is read:
options that do not combine (one table, `_REFUSALS`), limits the model sets (max_model_len,
sliding window), the device, tensor-parallel shard plans, and the KV cache's size. The only
config left open is a KV cache sized by `gpu_memory_utilization` (measured once weights are
on the GPU, engine/load.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from embedserve.attention.metadata import AttentionFn
from embedserve.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    PoolingConfig,
    PoolingMethod,
    SchedulerConfig,
)
from embedserve.engine.lora_options import lora_settings
from embedserve.engine.options import TASK_NAMES, EngineOptions
from embedserve.engine.quantize import resolve_quantization
from embedserve.errors import ModelLoadError
from embedserve.kernels.isa import cpu_dtype, parse_dtype
from embedserve.kv_cache.manager import blocks_for
from embedserve.models.registry import CLASSIFIER, rerank_kind
from embedserve.models.source import ModelSource
from embedserve.parallel.setup import check_parallel
from embedserve.worker.buckets import token_buckets as bucket_sizes
from embedserve.worker.gpu_memory import check_utilization
from embedserve.worker.model_runner import kv_bytes_per_block

_DEFAULT_KV_CAP = 4 << 30  # default KV budget cap (bytes) unless one full prompt needs more
# Decoders on the CPU run prompts of at least this many tokens (and two token budgets)
# layer-major by default: chunk-major would keep every layer's K/V and gather it back from the
# paged cache for every later chunk; layer-major reads one contiguous layer of K/V and reuses
# each layer's weights while they are hot (docs/performance.md, "Layer-major prefill for long inputs").
_LAYER_MAJOR_DEFAULT = 4096
# Deterministic mode cuts every prompt at multiples of this many tokens: the native flash
# kernel's key block, so a chunk's keys fall in the same blocks whichever path runs it.
DETERMINISTIC_CHUNK = 256


@dataclass(frozen=True)
class _Case:
    """What a refusal looks at: the options, the model and the forced attention route."""

    options: EngineOptions
    multimodal: bool
    tensor_parallel: bool
    attention: AttentionFn | None
    causal: bool


@dataclass(frozen=True)
class _Refusal:
    stage: str  # "model": before anything else; "parallel": once the model can be split at all
    when: Callable[[_Case], bool]
    message: str


def _bucketed(options: EngineOptions) -> bool:
    return options.token_buckets or options.compile_backend is not None


def _tp(option: str, given: Callable[[_Case], bool]) -> _Refusal:
    message = f"{option} is not supported with tensor_parallel_size > 1"
    return _Refusal("parallel", lambda c: c.tensor_parallel and given(c), message)


# Options that do not combine, checked stage by stage in this order; the first that applies is
# the error. The "parallel" rows run after `check_parallel` found the model can be split.
_REFUSALS: tuple[_Refusal, ...] = (
    _Refusal(
        "model",
        lambda c: c.multimodal and bool(c.options.layer_major_tokens),
        "layer_major_tokens is not available for multimodal models (images run chunked)",
    ),
    _Refusal(
        "model",
        lambda c: c.multimodal and _bucketed(c.options),
        "token_buckets / compile_backend are not available for multimodal models",
    ),
    _Refusal(
        "model",
        lambda c: c.multimodal and c.options.deterministic,
        "deterministic mode is not available for multimodal models",
    ),
    _Refusal(
        "model",
        lambda c: c.multimodal and c.tensor_parallel,
        "tensor parallelism does not cover multimodal (Qwen3-VL) models yet: use tensor_parallel_size 1",
    ),
    _Refusal(
        "model",
        lambda c: c.options.enable_prefix_caching is True and not c.causal,
        "enable_prefix_caching needs a decoder: an encoder keeps no KV cache to share",
    ),
    _Refusal(
        "model",
        lambda c: c.options.enable_prefix_caching is True and c.multimodal,
        "enable_prefix_caching is not available for multimodal models (image tokens of different images "
        "have the same ids)",
    ),
    _Refusal(
        "model",
        lambda c: c.options.enable_prefix_caching is True and c.options.deterministic,
        "enable_prefix_caching does not combine with deterministic mode (a cached prefix moves where "
        "chunks are cut, and with them the bits): choose one",
    ),
    _tp("layer_major_tokens", lambda c: bool(c.options.layer_major_tokens)),
    _tp("token_buckets", lambda c: c.options.token_buckets),
    _tp("compile", lambda c: c.options.compile_backend is not None),
    _tp("deterministic", lambda c: c.options.deterministic),
    _tp("gpu_memory_utilization", lambda c: c.options.gpu_memory_utilization is not None),
    _tp("attention", lambda c: c.attention is not None),
)


def refuse_combinations(
    stage: str, options: EngineOptions, files: ModelSource, attention: AttentionFn | None = None
) -> None:
    """ModelLoadError with the first `_REFUSALS` message of `stage` that applies."""
    tp = options.tensor_parallel_size
    case = _Case(
        options,
        files.multimodal is not None,
        isinstance(tp, int) and tp > 1,
        attention,
        files.model.is_causal,
    )
    for refusal in _REFUSALS:
        if refusal.stage == stage and refusal.when(case):
            raise ModelLoadError(refusal.message)


def resolve(options: EngineOptions, files: ModelSource, attention: AttentionFn | None = None) -> EngineConfig:
    """The engine's whole configuration; ModelLoadError naming the first option that cannot be."""
    refuse_combinations("model", options, files, attention)
    task, kind = _task_kind(options.task, files)
    mcfg = files.model
    pooling = files.pooling
    if kind is not None:  # the head reads the pair's unnormalized row: CLS or the last token
        pooling = PoolingConfig(PoolingMethod.LAST if mcfg.is_causal else PoolingMethod.CLS, False)
    max_model_len = _max_model_len(options.max_model_len, files)
    device = torch.device(options.device)
    dtype = cpu_dtype(parse_dtype(options.dtype), device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device='cuda' requested but no CUDA device is available")
    tp = check_parallel(options.tensor_parallel_size, files, device)
    refuse_combinations("parallel", options, files, attention)
    # The layer-major lane runs plain text decoders: not the ranks, not images (M-RoPE, vision rows).
    lane = tp == 1 and files.multimodal is None
    sched = _scheduler(options, mcfg, max_model_len, device, lane)
    if options.gpu_memory_utilization is not None:
        check_utilization(options.gpu_memory_utilization, device, options.kv_cache_memory, mcfg.is_causal)
    return EngineConfig(
        model_path=str(files.path),
        model=mcfg,
        pooling=pooling,
        cache=replace(_cache(options, mcfg, sched, dtype), prefix_caching=_prefix_caching(options, files)),
        scheduler=sched,
        dtype=dtype,
        device=device,
        prompts=files.prompts,
        default_prompt_name=files.default_prompt_name,
        task=task,
        deterministic=options.deterministic,
        tensor_parallel_size=tp,
        multimodal=files.multimodal is not None,
        rerank_kind=kind,
        token_buckets=bucket_sizes(options.max_num_batched_tokens) if _bucketed(options) else None,
        compile_backend=options.compile_backend,
        gpu_memory_utilization=options.gpu_memory_utilization,
        max_image_pixels=options.max_image_pixels,  # None: the prompter's defaults (tokenizer/multimodal.py)
        max_images_per_input=options.max_images_per_input,
        lora=lora_settings(options, files),
        quantization=resolve_quantization(options, files),
    )


def _prefix_caching(options: EngineOptions, files: ModelSource) -> bool:
    """On unless switched off, for the models it applies to (the refusals above turned an
    explicit request on one it does not apply to into an error)."""
    applies = files.model.is_causal and files.multimodal is None and not options.deterministic
    return applies and options.enable_prefix_caching is not False


def _task_kind(task: str, files: ModelSource) -> tuple[str, str | None]:
    """The task the model is served for and its score head's kind (None: embed). auto: a
    *ForSequenceClassification of one label reranks (a cross-encoder), of more classifies."""
    if task not in TASK_NAMES:
        raise ModelLoadError(f"unknown task {task!r}; choose one of {', '.join(TASK_NAMES)}")
    kind = rerank_kind(files.model, files.path)
    labels = files.model.labels
    if task == "embed":
        return task, None
    if task == "classify" and kind != CLASSIFIER:
        raise ModelLoadError(
            f"{files.path} is not a classifier: classify needs a *ForSequenceClassification model"
        )
    if task == "rerank" and kind is None:
        raise ModelLoadError(
            f"{files.path} is not a reranker: rerank needs a *ForSequenceClassification cross-encoder "
            "or a Qwen3-Reranker-style causal LM (a directory named *reranker*)"
        )
    if task == "rerank" and len(labels) > 1:
        raise ModelLoadError(
            f"{files.path} is a classifier of {len(labels)} labels: rerank needs one label; "
            "serve it with task classify"
        )
    if task == "auto":
        task = "embed" if kind is None else "classify" if len(labels) > 1 else "rerank"
    return task, kind


def _max_model_len(option: int | None, files: ModelSource) -> int:
    """The option, within what the model's positions and (unimplemented) sliding window allow."""
    mcfg = files.model
    limit = min(x for x in (mcfg.max_position_embeddings, files.max_seq_length, files.sliding_window) if x)
    if option is None:
        return limit
    if files.sliding_window is not None and option > files.sliding_window:
        raise ModelLoadError(
            f"max_model_len {option} exceeds the sliding window ({files.sliding_window}); "
            "sliding-window attention is not implemented, so inputs must fit the window"
        )
    if option > mcfg.max_position_embeddings:
        raise ModelLoadError(
            f"max_model_len {option} exceeds max_position_embeddings ({mcfg.max_position_embeddings})"
        )
    return option


def _layer_major_tokens(option: int | None, device: torch.device, causal: bool, budget: int) -> int | None:
    """The lane threshold: explicit (0 = off), else a CPU decoder default; None = no lane."""
    if option is None:
        return max(_LAYER_MAJOR_DEFAULT, 2 * budget) if causal and device.type == "cpu" else None
    if isinstance(option, bool) or not isinstance(option, int) or option < 0:
        raise ModelLoadError(f"layer_major_tokens must be an integer >= 0 (0 turns it off), got {option!r}")
    if option and not causal:
        raise ModelLoadError("layer_major_tokens applies to decoder models only (encoders run inputs whole)")
    return option or None


def _scheduler(
    options: EngineOptions, mcfg: ModelConfig, max_model_len: int, device: torch.device, lane: bool
) -> SchedulerConfig:
    budget = options.max_num_batched_tokens
    try:
        return SchedulerConfig(
            max_num_batched_tokens=budget,
            max_num_seqs=options.max_num_seqs,
            batch_tokens_with_online=options.batch_tokens_with_online,
            layer_major_tokens=_layer_major_tokens(
                options.layer_major_tokens if lane else 0, device, mcfg.is_causal, budget
            ),
            max_model_len=max_model_len,
            allow_chunking=mcfg.is_causal,
            deterministic_chunk=DETERMINISTIC_CHUNK if options.deterministic and mcfg.is_causal else None,
        )
    except ValueError as e:  # e.g. an encoder budget below max_model_len: a configuration error
        raise ModelLoadError(str(e)) from None


def _cache(
    options: EngineOptions, mcfg: ModelConfig, sched: SchedulerConfig, dtype: torch.dtype
) -> CacheConfig:
    """The KV cache's blocks: an encoder's count only the tokens in flight; a decoder's hold two of
    the longest prompts it may see (4 GB at most, one such prompt at least) unless given."""
    block_size, memory = options.block_size, options.kv_cache_memory
    if not mcfg.is_causal:
        # An encoder keeps no KV cache: each request finishes in the step that schedules it, so
        # one step's worth (plus a partly filled block per sequence) is all it can hold.
        if memory is not None:
            raise ModelLoadError("kv_cache_memory does not apply to encoder models: they keep no KV cache")
        blocks = blocks_for(sched.max_num_batched_tokens, block_size) + sched.max_num_seqs
        return CacheConfig(block_size=block_size, kv_cache_memory=0, num_blocks=blocks)
    if options.gpu_memory_utilization is not None:  # sized once the weights are on the GPU
        return CacheConfig(block_size=block_size, kv_cache_memory=None, num_blocks=0)
    per_block = kv_bytes_per_block(mcfg, block_size, dtype)
    # the longest prompt the KV cache must hold: longer ones run in the layer-major lane
    lane_from = sched.layer_major_tokens
    longest = sched.max_model_len if lane_from is None else min(sched.max_model_len, lane_from - 1)
    if memory is None:
        wanted = max(2 * longest, sched.max_num_batched_tokens)
        floor = blocks_for(max(longest, 1), block_size) * per_block
        memory = max(min(blocks_for(wanted, block_size) * per_block, _DEFAULT_KV_CAP), floor)
    if memory // per_block < 1:
        raise ModelLoadError(
            f"kv_cache_memory={memory} bytes is smaller than one KV block ({per_block} bytes)"
        )
    return CacheConfig(block_size=block_size, kv_cache_memory=memory, num_blocks=memory // per_block)
