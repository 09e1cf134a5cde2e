"""Gemma 3 text models over packed whole sequences: EmbeddingGemma (bidirectional) and the causal LMs.

Per layer (models/gemma3_config.py reads the numbers):

    x -> RMSNorm -> attention -> RMSNorm -> + x -> RMSNorm -> MLP -> RMSNorm -> + (residual)

* RMSNorm scales by (1 + w), in float32, cast back after the weight (Llama casts before it);
* q and k are RMS-normed per head before RoPE; scores scale by query_pre_attn_scalar ** -0.5;
* sliding layers attend within their band at O(n * w) (attention/windowed.py) with RoPE base
  `local_rope_theta`, full layers everywhere with `rope_theta`;
* the MLP is gelu_tanh(x G^T) * (x U^T) -> D; token embeddings are scaled by sqrt(hidden),
  the scale rounded to the weights' dtype as transformers does.

Every input runs whole in one step with no KV cache (as encoders do): a bidirectional band
cannot be chunked, and a causal Gemma3 is served the same way (docs/models.md).
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


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, window: int) -> None:
        super().__init__()
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        kv = self.kv_heads * self.head_dim
        self.sizes = [self.heads * self.head_dim, kv, kv]
        self.qkv_proj = Linear(cfg.hidden_size, sum(self.sizes), bias=cfg.qkv_bias)
        self.o_proj = Linear(self.sizes[0], cfg.hidden_size, bias=cfg.qkv_bias)
        self.q_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.window, self.causal, self.scale = window, cfg.causal_mask, cfg.attention_scale

    def forward(
        self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
    ) -> torch.Tensor:
        # x: [T, hidden] (every sequence of the step, packed) -> [T, hidden]
        q, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)
        q = self.q_norm(q.view(-1, self.heads, self.head_dim))
        k = self.k_norm(k.view(-1, self.kv_heads, self.head_dim))
        v = v.view(-1, self.kv_heads, self.head_dim)
        cos, sin = cos_sin
        q, k = Rotary.apply(q, cos, sin), Rotary.apply(k, cos, sin)
        return self.o_proj(banded_attention(q, k, v, meta, self.scale, self.window, self.causal))


class Gemma3Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, window: int) -> None:
        super().__init__()
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.window = window
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.self_attn = Gemma3Attention(cfg, window)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.gate_up_proj = Linear(hidden, 2 * cfg.intermediate_size, bias=False)  # gate | up
        self.down_proj = Linear(cfg.intermediate_size, hidden, bias=False)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)

    def forward(
        self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
    ) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos_sin, meta))
        gate, up = self.gate_up_proj(self.pre_feedforward_layernorm(x)).chunk(2, dim=-1)
        h = self.down_proj(functional.gelu(gate, approximate="tanh") * up)
        return x + self.post_feedforward_layernorm(h)


class Gemma3Model(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Gemma3Layer(cfg, w) for w in cfg.layer_windows)
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_full = Rotary(cfg.head_dim, cfg.rope_theta)
        self.rotary_full.inv_freq /= cfg.rope_factor  # linear scaling: positions / factor
        self.rotary_local = Rotary(cfg.head_dim, cfg.local_rope_theta)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor] | None,
        meta: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [T] of whole sequences. Returns final hidden states
        [len(output_rows), hidden]."""
        check_whole(kv_caches, meta)
        weight = self.embed_tokens.weight
        scale = torch.tensor(self.config.hidden_size**0.5, dtype=weight.dtype)
        x = self.embed_tokens(input_ids) * scale  # [T, hidden]
        full = self.rotary_full.cos_sin(positions, x.dtype)
        local = self.rotary_local.cos_sin(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, local if layer.window else full, meta)
        x = x if output_rows is None else x.index_select(0, output_rows)
        return self.norm(x)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        cfg = self.config
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim

        def shard_sizes(name: str) -> list[int] | None:
            if ".qkv_proj." in name:
                return [q, kv, kv]
            return [cfg.intermediate_size] * 2 if ".gate_up_proj." in name else None

        load_fused(self, weights, _route, shard_sizes, cfg.architecture)


_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("gate_up_proj", 0),
    "mlp.up_proj": ("gate_up_proj", 1),
    "mlp.down_proj": ("down_proj", None),
}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)\.(weight|bias)$")


def _route(raw_name: str) -> Route | None:
    name = raw_name.removeprefix("model.")
    if name.startswith("lm_head.") or name.endswith("rotary_emb.inv_freq"):
        return None  # the LM head (tied to the embeddings) is not used
    if m := _LAYER.match(name):
        layer, module, param = m.groups()
        if module in _FUSED:
            ours, shard = _FUSED[module]
            return f"layers.{layer}.{ours}.{param}", shard
    return name, None  # load_fused rejects a name that is not ours
