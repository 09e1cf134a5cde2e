"""Qwen3-VL for embeddings: the Qwen3 decoder with M-RoPE, image rows in place of the image
tokens' embeddings and DeepStack rows added to them after the first k layers; plus its tower.

One step's packed rows (two requests, the first with an image in this chunk):

    rows:     0 1 2 [3 4 5 6] 7 8 | 9 10 11
    vision.rows = [3, 4, 5, 6]: embeddings replaced by the tower's main rows; after layer j < k,
    x[vision.rows] += deepstack_j rows (the same tokens' rows of deepstack merger j)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from embedserve.attention.cpu import paged_attention
from embedserve.attention.metadata import AttentionFn, AttentionMetadata
from embedserve.config import ModelConfig
from embedserve.models.decoder import DecoderModel
from embedserve.models.decoder import _route as text_route
from embedserve.models.qwen3_vl.mrope import MRotary
from embedserve.models.qwen3_vl.vision import VisionTower
from embedserve.models.weights import Route, load_fused

if TYPE_CHECKING:
    from embedserve.models.qwen3_vl.spec import Qwen3VLSpec


@dataclass(frozen=True)
class VisionRows:
    """Image tokens of one step: packed row indices and their tower rows."""

    rows: torch.Tensor  # [V] long
    main: torch.Tensor  # [V, hidden]
    deepstack: list[torch.Tensor]  # k x [V, hidden]


class Qwen3VLModel(DecoderModel):
    def __init__(self, cfg: ModelConfig, spec: Qwen3VLSpec, attend: AttentionFn = paged_attention) -> None:
        super().__init__(cfg, attend)
        self.spec = spec
        self.rotary = MRotary(cfg.head_dim, cfg.rope_theta, spec.mrope_section)
        self.visual = VisionTower(spec.vision)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor] | None,
        meta: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
        vision: VisionRows | None = None,
    ) -> torch.Tensor:
        """input_ids [T]; positions [T] or [3, T] (M-RoPE). Returns [len(output_rows), hidden]."""
        x = self.embed_tokens(input_ids)  # [T, hidden]
        deep: list[torch.Tensor] = []
        if vision is not None:
            x[vision.rows] = vision.main.to(x.dtype)
            deep = vision.deepstack
        cos_sin = self.rotary.cos_sin(positions, x.dtype)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            cache = None if kv_caches is None else kv_caches[i]
            rows = output_rows if i == last and i >= len(deep) else None  # see DecoderModel.forward
            x = layer(x, cos_sin, cache, meta, rows)
            if i < len(deep) and vision is not None:
                x[vision.rows] = x[vision.rows] + deep[i].to(x.dtype)
        if output_rows is not None and last < len(deep):
            x = x.index_select(0, output_rows)
        return self.norm(x)

    def encode_images(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """The tower on these images -> [tokens, hidden * (1 + k)]: [main | deepstack_1 .. k]."""
        return self.visual(pixels, grids)

    def split_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """[V, hidden * (1 + k)] cached rows -> main [V, hidden], k deepstack [V, hidden]."""
        parts = list(torch.split(rows, self.config.hidden_size, dim=-1))
        return parts[0], parts[1:]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Both layouts: `model.language_model.*` / `model.visual.*` (+ lm_head, skipped) as
        Qwen3VLForConditionalGeneration saves them, `language_model.*` / `visual.*` as
        Qwen3VLModel does."""
        load_fused(self, _normalized(weights), _vl_route, self.shard_sizes, self.config.architecture)


def _normalized(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for raw, tensor in weights:
        name = raw.removeprefix("model.")
        if name.startswith("language_model."):
            yield name.removeprefix("language_model."), tensor
        elif name.startswith("visual."):
            if name == "visual.patch_embed.proj.weight":
                tensor = tensor.reshape(tensor.shape[0], -1)  # Conv3d [d, C, T, P, P] -> [d, C*T*P*P]
            yield name, tensor
        elif not name.startswith("lm_head."):
            yield raw, tensor  # unexpected: load_fused names it


def _vl_route(name: str) -> Route | None:
    return (name, None) if name.startswith("visual.") else text_route(name)
