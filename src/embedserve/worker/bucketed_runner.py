"""A ModelRunner whose steps run at token-bucket sizes, optionally through `torch.compile`
(`build_engine(token_buckets=True, compile_backend=...)`, `--token-buckets`, `--compile`).

Off by default and unmeasured on a GPU: engine steps here are long prefill steps (thousands
of tokens, tens to hundreds of milliseconds), where launch overhead is a small share; the gain
would come from compiling the memory-bound glue (RMSNorm, RoPE, SiLU) into fused kernels.
Attention stays eager (the CUDA routes are graph breaks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Self

import torch

from embedserve.config import EngineConfig
from embedserve.models.build import EmbeddingModel
from embedserve.worker.buckets import bucket_for, pad_step_inputs
from embedserve.worker.input_batch import StepInputs
from embedserve.worker.model_runner import ModelRunner


class BucketedModelRunner(ModelRunner):
    @classmethod
    def for_config(cls, model: EmbeddingModel, config: EngineConfig) -> Self:
        """ModelRunner's, with the config's token buckets and compile backend."""
        cache, buckets = config.cache, config.token_buckets
        assert buckets is not None
        return cls(
            model, cache.num_blocks, cache.block_size, config.dtype, config.device, buckets,
            config.compile_backend, config.scheduler.deterministic_chunk,
        )  # fmt: skip

    def __init__(
        self,
        model: EmbeddingModel,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        buckets: Sequence[int],
        compile_backend: str | None = None,
        deterministic_chunk: int | None = None,
    ) -> None:
        if not buckets or list(buckets) != sorted(set(buckets)):
            raise ValueError(f"buckets must be a non-empty ascending list of sizes, got {list(buckets)}")
        super().__init__(model, num_blocks, block_size, dtype, device, deterministic_chunk)
        self.buckets = tuple(buckets)
        # the model, or torch.compile of it (one graph set per bucket size)
        self.compiled: Callable[..., Any] = model
        if compile_backend is not None:
            self.compiled = torch.compile(model, dynamic=False, backend=compile_backend)
        self.step_sizes: set[int] = set()  # bucket sizes run so far

    def forward(self, inputs: StepInputs) -> torch.Tensor:
        size = bucket_for(inputs.input_ids.numel(), self.buckets)
        self.step_sizes.add(size)
        padded = pad_step_inputs(inputs, size)
        # [R, hidden]: output_rows index real rows only
        if padded.token_type_ids is not None:
            return self.compiled(
                padded.input_ids,
                padded.positions,
                self.kv_caches,
                padded.meta,
                padded.output_rows,
                token_type_ids=padded.token_type_ids,
            )
        return self.compiled(
            padded.input_ids, padded.positions, self.kv_caches, padded.meta, padded.output_rows
        )
