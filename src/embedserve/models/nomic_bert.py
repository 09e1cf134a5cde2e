"""NomicBert encoders (nomic-embed-text-v1 / v1.5) over packed whole sequences.

BERT's post-LN blocks with what decoders brought: rotary positions (base 1,000, rotate-half,
every dimension) instead of a position table, a fused QKV projection, a SwiGLU MLP
(silu(x G^T) * (x U^T)), no biases; word + segment embeddings then LayerNorm:

    x = LN(embed(ids) + type(0));  per layer:  x = LN(x + attn(x));  x = LN(x + mlp(x))

Both weight spellings load: nomic's own (`emb_ln`, `encoder.layers.N.attn.Wqkv`, `mlp.fc11`
(up) / `fc12` (gate) / `fc2`, `norm1`, `norm2`) and transformers' `NomicBertModel`'s.
models/nomic_config.py reads both config spellings and refuses what is not implemented.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from embedserve.attention.cpu import paged_attention
from embedserve.attention.metadata import AttentionMetadata, check_whole
from embedserve.config import ModelConfig
from embedserve.models.decoder_layer import Rotary
from embedserve.models.linear import Linear, SiluGateUp
from embedserve.models.weights import Route, load_fused


class NomicLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = cfg.hidden_size
        self.heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.qkv = Linear(hidden, 3 * hidden, bias=False)
        self.attn_out = Linear(hidden, hidden, bias=False)
        self.attn_norm = nn.LayerNorm(hidden, eps=cfg.layer_norm_eps)
        self.gate_up = SiluGateUp(hidden, cfg.intermediate_size)
        self.down = Linear(cfg.intermediate_size, hidden, bias=False)
        self.mlp_norm = nn.LayerNorm(hidden, eps=cfg.layer_norm_eps)

    def forward(
        self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
    ) -> torch.Tensor:
        # x: [T, hidden]
        q, k, v = self.qkv(x).view(-1, 3, self.heads, self.head_dim).unbind(1)
        cos, sin = cos_sin
        q, k = Rotary.apply(q, cos, sin), Rotary.apply(k, cos, sin)
        attn = paged_attention(q, k, v, None, meta, self.head_dim**-0.5)  # whole sequences, no cache
        x = self.attn_norm(x + self.attn_out(attn))
        return self.mlp_norm(x + self.down(self.gate_up(x)))


class NomicBertModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size) if cfg.type_vocab_size else None
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(NomicLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor] | None,
        meta: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions (token_type_ids: a pair's segments): [T] of whole sequences.
        Returns final hidden states [len(output_rows), hidden]."""
        check_whole(kv_caches, meta)
        x = self.word(input_ids)
        if self.token_type is not None:
            x = x + (self.token_type.weight[0] if token_type_ids is None else self.token_type(token_type_ids))
        x = self.norm(x)
        cos_sin = self.rotary.cos_sin(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos_sin, meta)
        return x if output_rows is None else x.index_select(0, output_rows)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        cfg = self.config

        def shard_sizes(name: str) -> list[int] | None:
            if ".qkv." in name:
                return [cfg.hidden_size] * 3
            return [cfg.intermediate_size] * 2 if ".gate_up." in name else None

        load_fused(self, _split_wqkv(weights), _route, shard_sizes, cfg.architecture)


# module name (either spelling) -> (ours, shard in a fused parameter)
_LAYER_NAMES: dict[str, tuple[str, int | None]] = {
    "self_attn.q_proj": ("qkv", 0),
    "self_attn.k_proj": ("qkv", 1),
    "self_attn.v_proj": ("qkv", 2),
    "attn.Wqkv.q": ("qkv", 0),  # nomic's fused Wqkv, split by `_split_wqkv`
    "attn.Wqkv.k": ("qkv", 1),
    "attn.Wqkv.v": ("qkv", 2),
    "self_attn.o_proj": ("attn_out", None),
    "attn.out_proj": ("attn_out", None),
    "post_attention_layernorm": ("attn_norm", None),
    "norm1": ("attn_norm", None),
    "mlp.gate_proj": ("gate_up", 0),
    "mlp.fc12": ("gate_up", 0),  # nomic: y = fc11(x) * act(fc12(x))
    "mlp.up_proj": ("gate_up", 1),
    "mlp.fc11": ("gate_up", 1),
    "mlp.down_proj": ("down", None),
    "mlp.fc2": ("down", None),
    "post_mlp_layernorm": ("mlp_norm", None),
    "norm2": ("mlp_norm", None),
}
_EMBEDDINGS = {
    "embeddings.word_embeddings": "word",
    "embeddings.token_type_embeddings": "token_type",
    "embeddings.LayerNorm": "norm",
    "emb_ln": "norm",
}
_LAYER = re.compile(r"^(?:encoder\.)?layers\.(\d+)\.(.+)\.(weight|bias)$")
_SKIPPED = (
    "lm_head.",
    "cls.",
    "pooler.",
    "classifier.",
    "embeddings.position_ids",
    "embeddings.token_type_ids",
)


def _split_wqkv(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
    """nomic's `attn.Wqkv.weight` [3 * hidden, hidden] as its q, k and v rows."""
    for name, tensor in weights:
        if ".attn.Wqkv." in name:
            stem, param = name.rsplit(".", 1)
            for part, rows in zip("qkv", tensor.chunk(3, dim=0), strict=True):
                yield f"{stem}.{part}.{param}", rows
        else:
            yield name, tensor


def _route(raw_name: str) -> Route | None:
    name = raw_name
    for prefix in ("nomic_bert.", "bert.", "model."):
        name = name.removeprefix(prefix)
    if name.startswith(_SKIPPED) or name.endswith("inv_freq"):
        return None
    if m := _LAYER.match(name):
        layer, module, param = m.groups()
        if module in _LAYER_NAMES:
            ours, shard = _LAYER_NAMES[module]
            return f"layers.{layer}.{ours}.{param}", shard
    stem, _, param = name.rpartition(".")
    if stem in _EMBEDDINGS:
        return f"{_EMBEDDINGS[stem]}.{param}", None
    return name, None  # not ours: load_fused rejects it by name
