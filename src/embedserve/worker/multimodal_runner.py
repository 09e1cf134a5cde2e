"""The model runner of a multimodal (Qwen3-VL) model: M-RoPE positions and image rows per step.

For each chunk of a request with images (a chunk holds each image whole or not at all):

    positions[:, rows of the chunk] = request's (t, h, w) positions [start, start + n)
    tower: every image of the step not in its request's encoder cache yet, in one call
    vision.rows = packed rows of the chunk's image tokens; main / deepstack rows from the cache

A step of text-only chunks runs exactly as the text model's runner does (1-D positions).
"""

from __future__ import annotations

import numpy as np
import torch

from embedserve.models.qwen3_vl.model import Qwen3VLModel, VisionRows
from embedserve.scheduler.output import SchedulerOutput
from embedserve.vision.state import MultimodalState
from embedserve.worker.input_batch import build_step_inputs
from embedserve.worker.model_runner import ModelRunner


class MultimodalRunner(ModelRunner):
    model: Qwen3VLModel

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> dict[int, torch.Tensor]:
        inputs = build_step_inputs(
            out, self.block_size, self.device, deterministic_chunk=self.deterministic_chunk
        )
        positions = inputs.positions
        vision = None
        if any(c.multimodal is not None for c in out.chunks):
            positions, vision = self.vision_inputs(out)
        hidden = (
            self.model(
                inputs.input_ids, positions, self.kv_caches, inputs.meta, inputs.output_rows, vision=vision
            )
            .float()
            .cpu()
        )
        return {rid: hidden[off : off + n] for rid, (off, n) in inputs.pooled.items()}

    def vision_inputs(self, out: SchedulerOutput) -> tuple[torch.Tensor, VisionRows | None]:
        """[3, T] positions of the step, and its image rows (None when no chunk holds an image)."""
        pos_parts: list[np.ndarray] = []
        row_parts: list[np.ndarray] = []
        cached: list[torch.Tensor] = []
        todo: list[tuple[MultimodalState, int]] = []
        q = 0
        for c in out.chunks:
            n = c.num_tokens
            mm = c.multimodal
            if mm is None:
                pos_parts.append(np.broadcast_to(np.arange(c.start, c.start + n, dtype=np.int64), (3, n)))
            else:
                pos_parts.append(mm.positions[:, c.start : c.start + n])
                for k in mm.images_in(c.start, n):
                    span = mm.spans[k]
                    row_parts.append(np.arange(q + span.start - c.start, q + span.end - c.start))
                    if k not in mm.encoder_cache:
                        todo.append((mm, k))
            q += n
        self.run_tower(todo)
        for c in out.chunks:
            if c.multimodal is not None:
                cached += [
                    c.multimodal.encoder_cache[k] for k in c.multimodal.images_in(c.start, c.num_tokens)
                ]
        positions = torch.from_numpy(np.concatenate(pos_parts, axis=1)).to(self.device)
        if not cached:
            return positions, None
        rows = torch.from_numpy(np.concatenate(row_parts)).to(self.device)
        main, deep = self.model.split_rows(torch.cat(cached) if len(cached) > 1 else cached[0])
        return positions, VisionRows(rows, main, deep)

    def run_tower(self, todo: list[tuple[MultimodalState, int]]) -> None:
        """The tower once over every image first scheduled in this step; rows into each
        request's encoder cache."""
        if not todo:
            return
        images = [mm.spans[k].image for mm, k in todo]
        pixels = torch.from_numpy(np.concatenate([img.pixels for img in images])).to(self.device)
        rows = self.model.encode_images(pixels, [img.grid for img in images])
        for (mm, k), part in zip(todo, torch.split(rows, [img.num_tokens for img in images]), strict=True):
            mm.encoder_cache[k] = part
