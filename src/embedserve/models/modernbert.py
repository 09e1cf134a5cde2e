"""ModernBERT encoders over packed whole sequences (gte-modernbert, modernbert-embed).

Pre-LN blocks (the first layer's attention reads the embedding's norm directly), LayerNorms
without bias, a fused QKV, a GeGLU MLP (gelu(x I^T) * (x G^T) from one `Wi`), no biases:

    x = LN(embed(ids));  per layer:  x = x + attn(LN(x));  x = x + mlp(LN(x));  out = LN(x)

Local layers attend within |q - k| <= local_attention / 2 at O(n * w) (attention/windowed.py)
with their own RoPE base, global layers everywhere (models/modernbert_config.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn
from torch.nn import functional

from embedserve.attention.metadata import AttentionMetadata, check_whole
from embedserve.attention.windowed import banded_attention
from embedserve.config import ModelConfig
from embedserve.models.decoder_layer import Rotary
from embedserve.models.linear import Linear
from embedserve.models.weights import Route, load_fused


def _norm(cfg: ModelConfig) -> nn.LayerNorm:
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=cfg.norm_bias)


class ModernBertLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, window: int, first: bool) -> None:
        super().__init__()
        hidden = cfg.hidden_size
        self.window, self.heads, self.head_dim = window, cfg.num_attention_heads, cfg.head_dim
        self.scale = cfg.attention_scale
        self.attn_norm = None if first else _norm(cfg)
        self.qkv = Linear(hidden, 3 * hidden, bias=cfg.qkv_bias)
        self.attn_out = Linear(hidden, hidden, bias=cfg.qkv_bias)
        self.mlp_norm = _norm(cfg)
        self.mlp_in = Linear(hidden, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)  # input | gate
        self.mlp_out = Linear(cfg.intermediate_size, hidden, bias=cfg.mlp_bias)

    def forward(
        self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
    ) -> torch.Tensor:
        # x: [T, hidden]
        h = x if self.attn_norm is None else self.attn_norm(x)
        q, k, v = self.qkv(h).view(-1, 3, self.heads, self.head_dim).unbind(1)
        cos, sin = cos_sin
        q, k = Rotary.apply(q, cos, sin), Rotary.apply(k, cos, sin)
        x = x + self.attn_out(banded_attention(q, k, v, meta, self.scale, self.window, False))
        a, gate = self.mlp_in(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.mlp_out(functional.gelu(a) * gate)


class ModernBertModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_norm = _norm(cfg)
        self.layers = nn.ModuleList(
            ModernBertLayer(cfg, w, first=i == 0) for i, w in enumerate(cfg.layer_windows)
        )
        self.final_norm = _norm(cfg)
        self.rotary_full = Rotary(cfg.head_dim, cfg.rope_theta)
        self.rotary_local = Rotary(cfg.head_dim, cfg.local_rope_theta)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor] | None,
        meta: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [T] of whole sequences -> final hidden states [len(output_rows), hidden]."""
        check_whole(kv_caches, meta)
        x = self.embed_norm(self.tok_embeddings(input_ids))
        full = self.rotary_full.cos_sin(positions, x.dtype)
        local = self.rotary_local.cos_sin(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, local if layer.window else full, meta)
        x = x if output_rows is None else x.index_select(0, output_rows)
        return self.final_norm(x)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_fused(self, weights, _route, lambda name: None, self.config.architecture)


_NAMES = {
    "attn_norm": "attn_norm",
    "attn.Wqkv": "qkv",
    "attn.Wo": "attn_out",
    "mlp_norm": "mlp_norm",
    "mlp.Wi": "mlp_in",
    "mlp.Wo": "mlp_out",
}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)\.(weight|bias)$")
_TOP = {
    "embeddings.tok_embeddings": "tok_embeddings",
    "embeddings.norm": "embed_norm",
    "final_norm": "final_norm",
}
_SKIPPED = ("head.", "decoder.", "classifier.", "drop.")


def _route(raw_name: str) -> Route | None:
    name = raw_name.removeprefix("model.")
    if name.startswith(_SKIPPED):
        return None  # the masked-LM or classifier head
    if m := _LAYER.match(name):
        layer, module, param = m.groups()
        if module in _NAMES:
            return f"layers.{layer}.{_NAMES[module]}.{param}", None
    stem, _, param = name.rpartition(".")
    if stem in _TOP:
        return f"{_TOP[stem]}.{param}", None
    return name, None  # not ours: load_fused rejects it by name
