"""BERT-family encoders (BERT, RoBERTa, XLM-R, MPNet) over packed tokens.

Bidirectional attention over each sequence's own tokens, absolute position embeddings, token
type 0 for every token of a single text
(a cross-encoder's pair passes its segment ids), post-LN residual blocks and exact (erf) GELU. Encoders
keep no KV cache and are never chunked: a sequence is always whole inside one step, so the
attention metadata carries no cached context. MPNet has no segment embeddings and adds a
relative position bias to every layer's scores (models/relative_bias.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn
from torch.nn.functional import scaled_dot_product_attention

from embedserve.attention.cpu import paged_attention
from embedserve.attention.metadata import AttentionMetadata, check_whole
from embedserve.attention.windowed import heads_first
from embedserve.config import ModelConfig
from embedserve.models.linear import Linear
from embedserve.models.relative_bias import RelativeBias
from embedserve.models.weights import Route, load_fused


class Embeddings(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.offset = cfg.position_offset
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position = nn.Embedding(cfg.max_position_embeddings + cfg.position_offset, cfg.hidden_size)
        # MPNet has none (type_vocab_size 0)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size) if cfg.type_vocab_size else None
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        # Same summation order as Hugging Face: (word + type) + position.
        x = self.word(input_ids)
        if self.token_type is not None:
            x = x + (self.token_type.weight[0] if token_type_ids is None else self.token_type(token_type_ids))
        x = x + self.position(positions + self.offset)
        return self.norm(x)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = cfg.hidden_size
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv = Linear(hidden, 3 * hidden)  # fused query | key | value
        self.attn_out = Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=cfg.layer_norm_eps)
        self.ffn_in = Linear(hidden, cfg.intermediate_size)
        self.ffn_out = Linear(cfg.intermediate_size, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=cfg.layer_norm_eps)

    def forward(
        self, x: torch.Tensor, meta: AttentionMetadata, biases: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        """x: [T, hidden]; `biases`: each sequence's additive score bias (MPNet), else None."""
        q, k, v = self.qkv(x).view(-1, 3, self.num_heads, self.head_dim).unbind(1)
        if biases is None:
            attn = paged_attention(q, k, v, None, meta, self.scale)  # [T, hidden]
        else:
            attn = biased_attention(q, k, v, meta, self.scale, biases)
        x = self.attn_norm(x + self.attn_out(attn))
        # GELU at the projection's padded row count (models/linear.py `padded`): torch runs it on
        # oneDNN, which builds a primitive per row count as for the projections
        h = nn.functional.gelu(self.ffn_in.padded(x))
        return self.ffn_norm(x + self.ffn_out(h)[: x.shape[0]])


# Hugging Face layer sub-module -> (ours, shard in the fused qkv). `attention.output.*` must be
# tried before the layer's own `output.*`.
_LAYER_NAMES: list[tuple[str, str, int | None]] = [
    ("attention.self.query", "qkv", 0),
    ("attention.self.key", "qkv", 1),
    ("attention.self.value", "qkv", 2),
    ("attention.output.dense", "attn_out", None),
    ("attention.output.LayerNorm", "attn_norm", None),
    ("attention.attn.q", "qkv", 0),  # MPNet's names
    ("attention.attn.k", "qkv", 1),
    ("attention.attn.v", "qkv", 2),
    ("attention.attn.o", "attn_out", None),
    ("attention.LayerNorm", "attn_norm", None),
    ("intermediate.dense", "ffn_in", None),
    ("output.dense", "ffn_out", None),
    ("output.LayerNorm", "ffn_norm", None),
]
_EMBEDDING_NAMES = {
    "word_embeddings": "word",
    "position_embeddings": "position",
    "token_type_embeddings": "token_type",
    "LayerNorm": "norm",
}
# Task heads (a cross-encoder's pooler + classifier: models/score_head.py) and cached buffers.
_SKIPPED = (
    "pooler.",
    "cls.",
    "classifier.",
    "lm_head.",
    "embeddings.position_ids",
    "embeddings.token_type_ids",
)
_LAYER = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias|gamma|beta)$")
_EMBEDDING = re.compile(r"^embeddings\.(\w+)\.(weight|bias|gamma|beta)$")
# Checkpoints converted from TensorFlow name LayerNorm parameters gamma / beta.
_PARAM = {"weight": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}


def _route(raw_name: str) -> Route | None:
    name = raw_name
    if name.endswith("encoder.relative_attention_bias.weight"):
        return "relative_bias.weight", None
    for prefix in ("bert.", "roberta.", "mpnet.", "model."):
        name = name.removeprefix(prefix)
    if name.startswith(_SKIPPED):
        return None
    if m := _LAYER.match(name):
        layer, module, param = m.groups()
        for hf, ours, shard in _LAYER_NAMES:
            if module == hf:
                return f"layers.{layer}.{ours}.{_PARAM[param]}", shard
    elif (m := _EMBEDDING.match(name)) and m.group(1) in _EMBEDDING_NAMES:
        return f"embeddings.{_EMBEDDING_NAMES[m.group(1)]}.{_PARAM[m.group(2)]}", None
    return name, None  # not ours: load_fused rejects it by name


class EncoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        buckets = cfg.relative_attention_buckets
        self.relative_bias = RelativeBias(buckets, cfg.num_attention_heads) if buckets else None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor] | None,
        meta: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions (token_type_ids: a pair's segments): [T]. Returns final hidden
        states [len(output_rows), hidden]."""
        check_whole(kv_caches, meta)
        x = self.embeddings(input_ids, positions, token_type_ids)
        rel = self.relative_bias
        biases = None if rel is None else [rel(s.q_len, x.dtype) for s in meta.seqs]  # one per sequence
        for layer in self.layers:
            x = layer(x, meta, biases)
        return x if output_rows is None else x.index_select(0, output_rows)

    def weight_route(self, raw_name: str) -> Route | None:
        """Where a Hugging Face tensor goes in this model (LoRA adapters use it too)."""
        return _route(raw_name)

    def shard_sizes(self, param: str) -> list[int] | None:
        return [self.config.hidden_size] * 3 if ".qkv." in param else None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_fused(self, weights, _route, self.shard_sizes, self.config.architecture)


def biased_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    biases: list[torch.Tensor],
) -> torch.Tensor:
    """Every sequence whole over its own keys, each score plus its bias ([1, heads, n, n])."""
    out = q.new_zeros(q.shape[0], q.shape[1] * q.shape[2])  # rows of no sequence stay 0
    for s, bias in zip(meta.seqs, biases, strict=True):
        rows = slice(s.q_start, s.q_start + s.q_len)
        keys = slice(s.q_start, s.q_start + (s.q_len if s.keys is None else s.keys))
        o = scaled_dot_product_attention(
            heads_first(q[rows]),
            heads_first(k[keys]),
            heads_first(v[keys]),
            attn_mask=bias[..., : keys.stop - keys.start],
            scale=scale,
        )
        out[rows] = o.squeeze(0).transpose(0, 1).flatten(1)
    return out
