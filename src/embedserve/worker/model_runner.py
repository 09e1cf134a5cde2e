"""Runs the model on one SchedulerOutput and hands pooling the rows it asked for."""

from __future__ import annotations

from dataclasses import replace
from typing import Self

import torch

from embedserve.config import EngineConfig, ModelConfig
from embedserve.kv_cache.manager import Copy
from embedserve.lora.rows import running, step_rows
from embedserve.models.build import EmbeddingModel
from embedserve.scheduler.output import SchedulerOutput
from embedserve.worker.input_batch import StepInputs, build_step_inputs


def by_adapter(out: SchedulerOutput) -> SchedulerOutput:
    """The step's chunks grouped by LoRA adapter (groups in order of first appearance, chunks in
    order within one): each adapter's rows are then one contiguous range of the step
    (lora/rows.py). Results are keyed by request: their order in the step changes nothing else."""
    if all(c.adapter is None for c in out.chunks):
        return out
    first: dict[int, int] = {}  # each adapter (or the base) by where its first chunk is
    for c in out.chunks:
        first.setdefault(id(c.adapter), len(first))
    return replace(out, chunks=sorted(out.chunks, key=lambda c: first[id(c.adapter)]))


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return cfg.num_hidden_layers * 2 * block_size * cfg.num_key_value_heads * cfg.head_dim * elem


class ModelRunner:
    @classmethod
    def for_config(cls, model: EmbeddingModel, config: EngineConfig) -> Self:
        """The runner an engine's config describes: its KV cache's blocks, dtype, device and
        deterministic chunk."""
        cache = config.cache
        return cls(
            model, cache.num_blocks, cache.block_size, config.dtype, config.device,
            config.scheduler.deterministic_chunk,
        )  # fmt: skip

    def __init__(
        self,
        model: EmbeddingModel,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        deterministic_chunk: int | None = None,
    ) -> None:
        """`deterministic_chunk`: deterministic mode's chunk size (worker/input_batch.py)."""
        cfg = model.config
        self.model = model
        self.block_size = block_size
        self.device = device
        self.deterministic_chunk = deterministic_chunk
        # Per layer: [2 (k, v), num_blocks * block_size slots, kv_heads, head_dim]. An encoder
        # runs each sequence whole in one step (never chunked), so it keeps no cache at all.
        # `empty`, not `zeros`: a slot is always written before it is read, and untouched pages
        # cost no resident memory (a zeroed 4 GB cache was 4 GB of RSS before any request).
        self.kv_caches = (
            [
                torch.empty(
                    (2, num_blocks * block_size, cfg.num_key_value_heads, cfg.head_dim),
                    dtype=dtype,
                    device=device,
                )
                for _ in range(cfg.num_hidden_layers)
            ]
            if cfg.is_causal
            else None
        )

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> dict[int, torch.Tensor]:
        """Returns request_id -> the pooled rows of its chunk, [k, hidden]."""
        if out.copies:
            self.copy_rows(out.copies)
        out = by_adapter(out)
        inputs = build_step_inputs(
            out,
            self.block_size,
            self.device,
            causal=self.model.config.is_causal,
            use_cache=self.kv_caches is not None,
            deterministic_chunk=self.deterministic_chunk,
        )
        adapters = step_rows(
            [(c.adapter, c.num_tokens, c.pool_rows[1] - c.pool_rows[0]) for c in out.chunks], self.device
        )
        with running(adapters):  # the LoRA adapters' rows, if any chunk runs one (lora/rows.py)
            hidden = self.forward(inputs).float().cpu()  # [R, hidden]
        return {rid: hidden[off : off + n] for rid, (off, n) in inputs.pooled.items()}

    def copy_rows(self, copies: list[Copy]) -> None:
        """Cached prompt rows into the blocks of the requests that start with them, every layer."""
        assert self.kv_caches is not None, "an encoder keeps no KV cache to copy"
        bs = self.block_size
        for c in copies:
            for cache in self.kv_caches:
                cache[:, c.dst * bs : c.dst * bs + c.rows] = cache[:, c.src * bs : c.src * bs + c.rows]

    def forward(self, inputs: StepInputs) -> torch.Tensor:
        """The model on one step's packed inputs -> the pooled rows, [R, hidden]."""
        if inputs.token_type_ids is not None:  # (query, document) pairs: encoders only
            return self.model(
                inputs.input_ids,
                inputs.positions,
                self.kv_caches,
                inputs.meta,
                inputs.output_rows,
                token_type_ids=inputs.token_type_ids,
            )
        return self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, inputs.output_rows)
