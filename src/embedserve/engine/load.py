"""Stage two of building an engine: the resolved config's model, with its weights where they run.

One process holds the whole model (its CPU projection weights packed once for oneDNN and moved
onto huge pages), or rank 0 of a tensor-parallel group whose other ranks load their own slices.
A KV cache sized by `gpu_memory_utilization` is measured here, with the weights on the GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from embedserve.attention.metadata import AttentionFn
from embedserve.config import EngineConfig
from embedserve.engine.adapters import Adapters
from embedserve.kernels.isa import kernel_isa
from embedserve.kernels.native import compiler
from embedserve.models.build import EmbeddingModel, build_model
from embedserve.models.decoder import DecoderModel
from embedserve.models.packing import for_codegen, prepack
from embedserve.models.short_path import short_path
from embedserve.models.source import ModelSource
from embedserve.parallel.runner import TensorParallelRunner
from embedserve.parallel.setup import start_parallel
from embedserve.settings import settings
from embedserve.worker.gpu_memory import gpu_kv_cache_memory
from embedserve.worker.host_memory import keep_freed_heap, packed_on_huge_pages, release_free_heap
from embedserve.worker.model_runner import kv_bytes_per_block

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loaded:
    config: EngineConfig  # the KV cache sized, where gpu_memory_utilization left it open
    model: EmbeddingModel
    workers: TensorParallelRunner | None  # tensor_parallel_size > 1: the ranks (rank 0 here)
    adapters: Adapters | None = None  # LoRA adapters (config.lora): merged, or applied per row


def load(config: EngineConfig, files: ModelSource, attention: AttentionFn | None = None) -> Loaded:
    """The model of `config` (built by engine/resolve.py from the same `files`)."""
    if config.device.type == "cpu":
        keep_freed_heap()  # activations reuse freed pages instead of faulting fresh ones in
    workers, adapters = None, None
    cache = config.cache
    if config.tensor_parallel_size > 1:  # rank 0 in this process, ranks 1.. in worker processes
        workers = start_parallel(
            files,
            config.tensor_parallel_size,
            cache.num_blocks,
            cache.block_size,
            config.dtype,
            config.device,
        )
        model: EmbeddingModel = workers.model
    else:
        model = build_model(files, config.device, config.dtype, attention)
        if config.lora is not None:  # before packing: a merge writes the plain weights
            adapters = Adapters.prepare(model, config.lora, config.device, config.task)
        if config.device.type == "cpu":
            prepare_cpu_weights(model, config)
    if config.gpu_memory_utilization is not None:
        memory = gpu_kv_cache_memory(
            model,
            config.scheduler,
            cache.block_size,
            config.dtype,
            config.device,
            config.gpu_memory_utilization,
        )
        blocks = memory // kv_bytes_per_block(config.model, cache.block_size, config.dtype)
        config = replace(config, cache=replace(cache, kv_cache_memory=memory, num_blocks=blocks))
    return Loaded(config, model, workers, adapters)


def prepare_cpu_weights(model: EmbeddingModel, config: EngineConfig) -> None:
    """Projection weights in the layout the CPU's matmuls read fastest.

    A compiling backend (inductor) emits its own matmuls, which cannot read oneDNN's opaque
    packed tensors: plain weights there. EMBEDSERVE_PREPACK=0 keeps plain weights (A/B runs)."""
    isa, cap = kernel_isa() if compiler() is not None else None, settings().cpu_isa
    ran = isa or "none: PyTorch ops (native kernels off, no C++ compiler, or no AVX2)"
    log.info("CPU kernels for %s%s", ran, f" (EMBEDSERVE_CPU_ISA={cap})" if cap else "")
    if config.compile_backend not in (None, "eager"):
        for_codegen(model)
    elif settings().prepack and config.quantization is None:  # int8: plain until quantized
        # weights packed once for oneDNN's matmuls (and the short-rows kernels')
        short_rows = settings().short_rows and not config.deterministic
        prepack(model, release_free_heap, short_rows=short_rows)
        packed_on_huge_pages(model)  # each short step reads them whole: fewer page walks
        short_steps(model, config)


def short_steps(model: EmbeddingModel, config: EngineConfig) -> None:
    """A decoder's short steps in one native call (models/short_path.py), where its projections
    run on the short-rows kernels: packed, or int8 weights (after engine/quantize.py)."""
    if settings().short_rows and not config.deterministic and type(model) is DecoderModel:
        model.short_path = short_path(model)
