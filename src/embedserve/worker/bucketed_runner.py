"""A ModelRunner whose steps run at token-bucket sizes, optionally through `torch.compile`.

Off by default and unmeasured on a GPU: engine steps here are long prefill steps (thousands
of tokens, tens to hundreds of milliseconds), where launch overhead is a small share; the gain
would come from compiling the memory-bound glue (RMSNorm, RoPE, SiLU) into fused kernels.
Attention stays eager (the routes in worker/cuda_attention.py are graph breaks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from embedserve.worker.buckets import bucket_for, pad_step_inputs
from embedserve.worker.input_batch import StepInputs
from embedserve.worker.model_runner import ModelRunner


class BucketedModelRunner(ModelRunner):
    buckets: tuple[int, ...]
    compiled: Callable[..., Any]  # the model, or torch.compile of it
    step_sizes: set[int]  # bucket sizes run so far: one compiled graph set each

    @classmethod
    def adopt(
        cls, runner: ModelRunner, buckets: Sequence[int], compile_backend: str | None = None
    ) -> BucketedModelRunner:
        """Take over `runner`'s model and KV cache tensors (no new allocation)."""
        if not buckets or list(buckets) != sorted(set(buckets)):
            raise ValueError(f"buckets must be a non-empty ascending list of sizes, got {list(buckets)}")
        new = cls.__new__(cls)
        new.__dict__.update(runner.__dict__)
        new.buckets = tuple(buckets)
        new.compiled = (
            torch.compile(runner.model, dynamic=False, backend=compile_backend)
            if compile_backend is not None
            else runner.model
        )
        new.step_sizes = set()
        return new

    def forward(self, inputs: StepInputs) -> torch.Tensor:
        size = bucket_for(inputs.input_ids.numel(), self.buckets)
        self.step_sizes.add(size)
        padded = pad_step_inputs(inputs, size)
        # [R, hidden]: output_rows index real rows only
        return self.compiled(
            padded.input_ids, padded.positions, self.kv_caches, padded.meta, padded.output_rows
        )
