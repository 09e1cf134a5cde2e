"""Decoder-only transformers (Qwen3, Qwen2, Llama, Mistral) over packed tokens.

One implementation, switched by config: Qwen3 normalizes q and k per head before RoPE
(`qk_norm`), Qwen2 has q/k/v bias (`qkv_bias`), Llama/Mistral have neither. The model knows
nothing about pooling: it returns final hidden states for the rows it is asked for. Here: the
stack (embedding, layers, final norm), the layer-major entry points and weight loading; one
layer's blocks are models/decoder_layer.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, cast

import torch
from torch import nn

from embedserve.attention.cpu import paged_attention
from embedserve.attention.metadata import AttentionFn, AttentionMetadata
from embedserve.config import ModelConfig
from embedserve.lora import rows as lora_rows
from embedserve.models.decoder_layer import DecoderLayer, RMSNorm, Rotary
from embedserve.models.weights import Route, load_fused


class StepShortcut(Protocol):
    """Runs a whole step's layers another way where it fits (models/short_path.py)."""

    def run(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_caches: list[torch.Tensor] | None,
        meta: AttentionMetadata,
    ) -> bool: ...


# Hugging Face parameter name fragments -> (our fused parameter, shard index in it).
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


@dataclass(frozen=True)
class LayerFlops:
    """FLOPs of one layer, for sizing work to a time (the layer-major lane)."""

    per_row: float  # one row through the whole layer: 2 per weight
    per_key: float  # attention's QK^T and PV, per row and per visible key
    per_stored_row: float  # a row whose K/V are stored but whose output is unused: input norm + QKV


class DecoderModel(nn.Module):
    # short steps natively, every layer in one call (models/short_path.py; set by the builder)
    short_path: StepShortcut | None = None

    def __init__(self, cfg: ModelConfig, attend: AttentionFn = paged_attention) -> None:
        """`attend`: the attention route for the device and dtype the model runs in
        (attention/select.py); the CPU route by default."""
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, attend) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor] | None,
        meta: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [T]. Returns final hidden states [len(output_rows), hidden]."""
        x = self.embed_tokens(input_ids)  # [T, hidden]
        cos_sin = self.rotary.cos_sin(positions, x.dtype)
        short = self.short_path if lora_rows.active() is None else None  # adapters run the projections
        if short is not None and short.run(x, cos_sin, kv_caches, meta):
            return self.norm(x if output_rows is None else x.index_select(0, output_rows))
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):  # the last layer finishes output_rows only
            cache = None if kv_caches is None else kv_caches[i]
            x = layer(x, cos_sin, cache, meta, output_rows if i == last else None)
        return self.norm(x)

    # ---- layer-major execution (worker/layer_major.py) -------------------------------------

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def final_norm(self, rows: torch.Tensor) -> torch.Tensor:
        """The last layer's output rows -> final hidden states (what `forward` returns)."""
        return self.norm(rows)

    def layer_flops(self) -> LayerFlops:
        layer = cast(DecoderLayer, self.layers[0])
        cfg = self.config
        return LayerFlops(
            per_row=2 * sum(p.numel() for p in layer.parameters() if p.dim() == 2),
            per_key=4 * cfg.num_attention_heads * cfg.head_dim,
            per_stored_row=2 * layer.self_attn.qkv_proj.weight.numel(),
        )

    def run_layer(
        self,
        index: int,
        x: torch.Tensor,
        positions: torch.Tensor,
        kv: torch.Tensor,
        start: int,
        keep: slice | None = None,
        deterministic_chunk: int | None = None,
    ) -> torch.Tensor:
        """Layer `index` on one chunk [start, start+T) of a sequence, x updated in place;
        `keep`: the chunk's rows read after this layer, `deterministic_chunk`: attention pieces (see
        `forward_buffered`)."""
        cos_sin = self.rotary.cos_sin(positions, x.dtype)
        layer = cast(DecoderLayer, self.layers[index])
        return layer.forward_buffered(x, cos_sin, kv, start, keep, deterministic_chunk)

    # ---- weights ---------------------------------------------------------------------------

    def weight_route(self, raw_name: str) -> Route | None:
        """Where a Hugging Face tensor goes in this model (LoRA adapters use it too)."""
        return _route(raw_name)

    def shard_sizes(self, param: str) -> list[int] | None:
        """Row split of a fused parameter (q|k|v or gate|up), None for the others."""
        cfg = self.config
        if ".qkv_proj." in param:
            q = cfg.num_attention_heads * cfg.head_dim
            kv = cfg.num_key_value_heads * cfg.head_dim
            return [q, kv, kv]
        if ".gate_up_proj." in param:
            return [cfg.intermediate_size, cfg.intermediate_size]
        return None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face tensors in (names with or without a `model.` prefix)."""
        load_fused(self, weights, _route, self.shard_sizes, self.config.architecture)


def _route(raw_name: str) -> Route | None:
    name = raw_name.removeprefix("model.")
    if name.startswith("lm_head.") or name.endswith("rotary_emb.inv_freq"):
        return None  # generation head and cached RoPE tables are not used
    for hf, (ours, idx) in _FUSED.items():
        if f".{hf}." in f".{name}":
            return name.replace(hf, ours), idx
    return name, None
