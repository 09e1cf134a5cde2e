"""Builds the engine's parts from a model directory: config, model, KV cache, scheduler, core."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from embedserve.attention.metadata import AttentionFn
from embedserve.config import (
    CacheConfig,
    EngineConfig,
    PoolingConfig,
    PoolingMethod,
    SchedulerConfig,
    parse_dtype,
)
from embedserve.engine.core import EngineCore
from embedserve.engine.multimodal import MultimodalPrompter, check_multimodal_options, multimodal_prompter
from embedserve.errors import ModelLoadError
from embedserve.kv_cache.manager import KVCacheManager, blocks_for
from embedserve.models.build import build_model, open_model
from embedserve.models.decoder import DecoderModel
from embedserve.models.linear import for_codegen, prepack
from embedserve.models.score_head import YES_NO, ScoreHead, load_score_head, rerank_kind
from embedserve.models.short_path import short_path
from embedserve.models.source import ModelSource, override_pooling
from embedserve.parallel.runner import TensorParallelRunner
from embedserve.parallel.setup import check_parallel, start_parallel
from embedserve.scheduler.scheduler import Scheduler
from embedserve.settings import settings
from embedserve.tokenizer import Tokenizer
from embedserve.worker.bucketed_runner import BucketedModelRunner
from embedserve.worker.buckets import token_buckets as bucket_sizes
from embedserve.worker.gpu_memory import check_utilization, gpu_kv_cache_memory
from embedserve.worker.host_memory import keep_freed_heap, packed_on_huge_pages, release_free_heap
from embedserve.worker.lane_runner import LaneRunner
from embedserve.worker.model_runner import ModelRunner, kv_bytes_per_block
from embedserve.worker.multimodal_runner import MultimodalRunner

_DEFAULT_KV_CAP = 4 << 30  # default KV budget cap (bytes) unless one full prompt needs more
# Decoders on the CPU run prompts of at least this many tokens (and two token budgets)
# layer-major by default: chunk-major would keep every layer's K/V and gather it back from the
# paged cache for every later chunk; layer-major reads one contiguous layer of K/V and reuses
# each layer's weights while they are hot (measured in docs/performance.md, "Layer-major
# prefill for long inputs").
_LAYER_MAJOR_DEFAULT = 4096
# Deterministic mode cuts every prompt at multiples of this many tokens: the native flash
# kernel's key block, so a piece's keys fall in the same blocks whichever path runs it.
DETERMINISTIC_CHUNK = 256


def _layer_major_tokens(option: int | None, device: torch.device, causal: bool, budget: int) -> int | None:
    """The lane threshold: explicit (0 = off), else a CPU decoder default; None = no lane."""
    if option is None:
        return max(_LAYER_MAJOR_DEFAULT, 2 * budget) if causal and device.type == "cpu" else None
    if isinstance(option, bool) or not isinstance(option, int) or option < 0:
        raise ModelLoadError(f"layer_major_tokens must be an integer >= 0 (0 turns it off), got {option!r}")
    if option and not causal:
        raise ModelLoadError("layer_major_tokens applies to decoder models only (encoders run inputs whole)")
    return option or None


@dataclass
class EngineParts:
    config: EngineConfig
    core: EngineCore  # synchronous; `Engine` runs it in a background thread
    tokenizer: Tokenizer
    score_head: ScoreHead | None = None  # rerankers only
    workers: TensorParallelRunner | None = None  # tensor_parallel_size > 1: the ranks to watch and stop
    prompter: MultimodalPrompter | None = None  # multimodal models: parts -> tokens + images


_TASKS = ("auto", "embed", "rerank")


def _task_kind(task: str, files: ModelSource) -> str | None:
    """The reranker kind the model is served as, or None to embed."""
    if task not in _TASKS:
        raise ModelLoadError(f"unknown task {task!r}; choose one of {', '.join(_TASKS)}")
    kind = rerank_kind(files.model, files.path)
    if task == "rerank" and kind is None:
        raise ModelLoadError(
            f"{files.path} is not a reranker: rerank needs a *ForSequenceClassification cross-encoder "
            "or a Qwen3-Reranker-style causal LM (a directory named *reranker*)"
        )
    return None if task == "embed" else kind


def build_engine(
    path: str | Path | ModelSource,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 256,
    batch_tokens_with_online: int | None = None,
    layer_major_tokens: int | None = None,
    max_model_len: int | None = None,
    kv_cache_memory: int | None = None,
    block_size: int = 16,
    pooling: str | None = None,
    normalize: bool | None = None,
    gpu_memory_utilization: float | None = None,
    token_buckets: bool = False,
    compile_backend: str | None = None,
    attention: AttentionFn | None = None,
    task: str = "auto",
    deterministic: bool = False,
    tensor_parallel_size: int = 1,
    max_image_pixels: int | None = None,
    max_images_per_input: int | None = None,
) -> EngineParts:
    """The engine's parts. `token_buckets`: run steps padded to a few fixed token counts
    (worker/buckets.py); `compile_backend`: also through `torch.compile` with that backend
    (implies buckets); `attention`: force an attention route (default: chosen per device and
    dtype by attention/select.py); `task`: "embed", "rerank" or "auto" (rerank for a
    reranker's directory, models/score_head.py); `deterministic`: every vector bit-identical whatever
    the batch, budget, chunking, preemption or path (docs/deterministic.md);
    `tensor_parallel_size`: split a decoder across that many ranks (docs/tensor-parallel.md);
    `max_image_pixels`, `max_images_per_input`: limits on a multimodal model's images
    (vision/prompt.py)."""
    if isinstance(path, ModelSource):  # already opened, e.g. random weights made on the GPU
        files = replace(path, pooling=override_pooling(path.pooling, pooling, normalize))
    else:
        files = open_model(path, pooling=pooling, normalize=normalize)
    mcfg = files.model
    if files.multimodal is not None:
        layer_major_tokens = check_multimodal_options(
            layer_major_tokens, token_buckets or compile_backend is not None, deterministic
        )
    kind = _task_kind(task, files)
    if kind is not None:  # the head reads the pair's unnormalized row: CLS or the last token
        files = replace(
            files, pooling=PoolingConfig(PoolingMethod.LAST if mcfg.is_causal else PoolingMethod.CLS, False)
        )
    limit = min(x for x in (mcfg.max_position_embeddings, files.max_seq_length, files.sliding_window) if x)
    if max_model_len is None:
        max_model_len = limit
    elif files.sliding_window is not None and max_model_len > files.sliding_window:
        raise ModelLoadError(
            f"max_model_len {max_model_len} exceeds the sliding window ({files.sliding_window}); "
            "sliding-window attention is not implemented, so inputs must fit the window"
        )
    elif max_model_len > mcfg.max_position_embeddings:
        raise ModelLoadError(
            f"max_model_len {max_model_len} exceeds max_position_embeddings ({mcfg.max_position_embeddings})"
        )
    torch_dtype = parse_dtype(dtype)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device='cuda' requested but no CUDA device is available")
    tp = check_parallel(
        tensor_parallel_size,
        files,
        dev,
        layer_major_tokens=layer_major_tokens,
        token_buckets=token_buckets,
        compile_backend=compile_backend,
        deterministic=deterministic,
        gpu_memory_utilization=gpu_memory_utilization,
        attention=attention,
    )
    if dev.type == "cpu":
        keep_freed_heap()  # activations reuse freed pages instead of faulting fresh ones in
    try:
        sched = SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            batch_tokens_with_online=batch_tokens_with_online,
            layer_major_tokens=_layer_major_tokens(  # no lane with tensor parallelism
                layer_major_tokens if tp == 1 else 0, dev, mcfg.is_causal, max_num_batched_tokens
            ),
            max_model_len=max_model_len,
            allow_chunking=mcfg.is_causal,
            deterministic_chunk=DETERMINISTIC_CHUNK if deterministic and mcfg.is_causal else None,
        )
    except ValueError as e:  # e.g. an encoder budget below max_model_len: a configuration error
        raise ModelLoadError(str(e)) from None
    if gpu_memory_utilization is not None:
        check_utilization(gpu_memory_utilization, dev, kv_cache_memory, mcfg.is_causal)
    if not mcfg.is_causal:
        # An encoder keeps no KV cache: the scheduler's blocks only count the tokens in flight,
        # and each request finishes in the step that schedules it, so one step's worth (plus a
        # partly filled block per sequence) is all it can hold.
        if kv_cache_memory is not None:
            raise ModelLoadError("kv_cache_memory does not apply to encoder models: they keep no KV cache")
        kv_cache_memory = 0
        num_blocks = blocks_for(max_num_batched_tokens, block_size) + max_num_seqs
    else:
        per_block = kv_bytes_per_block(mcfg, block_size, torch_dtype)
        # the longest prompt the KV cache must hold: longer ones run in the layer-major lane
        lane_from = sched.layer_major_tokens
        longest = max_model_len if lane_from is None else min(max_model_len, lane_from - 1)
        if kv_cache_memory is None and gpu_memory_utilization is None:
            wanted = max(2 * longest, max_num_batched_tokens)
            floor = blocks_for(max(longest, 1), block_size) * per_block
            kv_cache_memory = max(min(blocks_for(wanted, block_size) * per_block, _DEFAULT_KV_CAP), floor)
        # With gpu_memory_utilization the cache is sized below, once weights are on the GPU.
        num_blocks = (kv_cache_memory or 0) // per_block
        if num_blocks < 1 and gpu_memory_utilization is None:
            raise ModelLoadError(
                f"kv_cache_memory={kv_cache_memory} bytes is smaller than one KV block ({per_block} bytes)"
            )
    workers = None
    if tp > 1:  # rank 0 in this process, ranks 1.. in worker processes, each reads its slices
        workers = start_parallel(files, tp, num_blocks, block_size, torch_dtype, dev)
        model = workers.model
    else:
        model = build_model(files, dev, torch_dtype, attention)
        # EMBEDSERVE_PREPACK=0: plain weights (A/B runs). A compiling backend (inductor) emits
        # its own matmuls, which cannot read oneDNN's opaque packed tensors: plain weights there.
        codegen = compile_backend not in (None, "eager")
        if dev.type == "cpu" and codegen:
            for_codegen(model)
        elif dev.type == "cpu" and settings().prepack:
            # weights packed once for oneDNN's matmuls (and the short-rows kernels')
            short_rows = settings().short_rows and not deterministic
            prepack(model, release_free_heap, short_rows=short_rows)
            packed_on_huge_pages(model)  # each short step reads them whole: fewer page walks
            if short_rows and type(model) is DecoderModel:  # short steps: every layer in one call
                model.short_path = short_path(model)
    if gpu_memory_utilization is not None:
        util = gpu_memory_utilization
        kv_cache_memory = gpu_kv_cache_memory(model, sched, block_size, torch_dtype, dev, util)
        num_blocks = kv_cache_memory // kv_bytes_per_block(mcfg, block_size, torch_dtype)
    config = EngineConfig(
        model_path=str(files.path),
        model=mcfg,
        pooling=files.pooling,
        cache=CacheConfig(block_size=block_size, kv_cache_memory=kv_cache_memory),
        scheduler=sched,
        dtype=torch_dtype,
        device=dev,
        prompts=files.prompts,
        default_prompt_name=files.default_prompt_name,
        task="embed" if kind is None else "rerank",
        deterministic=deterministic,
        tensor_parallel_size=tp,
    )
    kv = KVCacheManager(num_blocks, block_size)
    piece = sched.deterministic_chunk
    runner = workers or ModelRunner(model, num_blocks, block_size, torch_dtype, dev, piece)
    if files.multimodal is not None:  # check_parallel refused tensor parallelism for it
        runner = MultimodalRunner(model, num_blocks, block_size, torch_dtype, dev, piece)
    if token_buckets or compile_backend is not None:
        sizes = bucket_sizes(max_num_batched_tokens)
        runner = BucketedModelRunner(
            model, num_blocks, block_size, torch_dtype, dev, sizes, compile_backend, piece
        )
    lane = None
    if sched.layer_major_tokens is not None:
        assert isinstance(model, DecoderModel)
        lane = LaneRunner(model, max_num_batched_tokens, dev, piece)
    core = EngineCore(Scheduler(sched, kv, mcfg.num_hidden_layers), runner, lane)
    tokenizer = Tokenizer(files.tokenizer(), mcfg.vocab_size)
    head = None
    if kind is not None:
        yes_no = None
        if kind == YES_NO:
            ids = [tokenizer.backend.token_to_id(t) for t in ("yes", "no")]
            if None in ids:
                raise ModelLoadError("the tokenizer has no 'yes' / 'no' token for a yes / no reranker")
            yes_no = (int(ids[0] or 0), int(ids[1] or 0))
        head = load_score_head(kind, files.weights(), yes_no)
    prompter = None
    if files.multimodal is not None:
        prompter = multimodal_prompter(files, max_image_pixels, max_images_per_input)
    return EngineParts(config, core, tokenizer, head, workers, prompter)
