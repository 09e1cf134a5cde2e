"""Short steps of a decoder in one native call (kernels/short_forward.py).

A step whose sequences all start at position 0 (nothing cached before them) and whose rows
fit the short-rows kernels (`short_linear.MAX_ROWS`) runs every layer natively: the same
kernels as the layer-by-layer path, in its order, without Python between them. Its vectors are
the Python path's but for the attention's rounding (float32 probabilities, where SDPA rounds
them to bfloat16). A step that does not fit (a chunk after a cached prefix, more rows, bucket
padding) runs layer by layer as before.

Built once, after `prepack(short_rows=True)` where every projection reads its packed weight
on the short-rows kernels, or once every projection holds int8 weights (engine/quantize.py:
float32 steps on the int8-weight kernel); each step checks the weights are still the modules'.
"""

from __future__ import annotations

import logging
from typing import cast

import torch

from embedserve.attention.metadata import AttentionMetadata, real_rows
from embedserve.kernels import short_forward
from embedserve.kernels.short_forward import LayerWeights, Projection, Shapes, ShortForward
from embedserve.models.decoder import DecoderModel
from embedserve.models.decoder_layer import DecoderLayer
from embedserve.models.linear import Linear, SiluGateUp

log = logging.getLogger(__name__)
# (module, attribute, what the plan reads there: a tensor, or a projection's int8 form)
Watched = list[tuple[torch.nn.Module, str, object]]


class ShortPath:
    """A decoder's short steps, natively; `run` says whether it took the step."""

    def __init__(self, native: ShortForward, watched: Watched) -> None:
        self.native = native
        self._watched = watched

    def takes(self, x: torch.Tensor, meta: AttentionMetadata) -> bool:
        """x's step fits: few rows of the plan's dtype, whole causal sequences back to back
        covering every row (no bucket padding), weights unchanged since the plan was built."""
        rows = x.shape[0]
        if not (0 < rows <= self.native.rows_limit and x.dtype == self.native.dtype and meta.causal):
            return False
        end = 0
        for s in meta.seqs:
            if s.start != 0 or s.q_start != end:
                return False
            end += s.q_len
        return end == rows == real_rows(meta) and all(getattr(m, n) is t for m, n, t in self._watched)

    def run(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_caches: list[torch.Tensor] | None,
        meta: AttentionMetadata,
    ) -> bool:
        """Every layer on x in place (K/V into the caches where the step maps slots), or False
        (x untouched) where the step does not fit."""
        if not self.takes(x, meta):
            return False
        cos, sin = (t[:, 0] for t in cos_sin)
        stored = kv_caches is not None and meta.slot_mapping is not None
        self.native.run(
            x, cos, sin, [(s.q_start, s.q_len) for s in meta.seqs],
            meta.slot_mapping if stored else None, kv_caches if stored else None,
        )  # fmt: skip
        return True


def _projections(layer: DecoderLayer, watched: Watched) -> tuple[Projection, ...] | None:
    """The layer's (qkv, o, gate, up, down) as the native loop reads them: all packed for the
    short-rows kernels, or all int8 weights; else None (a sharded projection, a mix)."""
    attn, mlp = layer.self_attn, layer.mlp
    plain, gated = (attn.qkv_proj, attn.o_proj, mlp.down_proj), mlp.gate_up_proj
    if any(type(m) is not Linear for m in plain) or type(gated) is not SiluGateUp:
        return None
    modules = (*plain, gated)
    if all(m.weights8 is not None for m in modules):  # int8 weights: watched as the form itself
        forms = [m.weights8 for m in modules if m.weights8 is not None]
        if [len(f.parts) for f in forms] != [1, 1, 1, 2]:
            return None
        watched += [(m, "weights8", f) for m, f in zip(modules, forms, strict=True)]
        (qkv,), (o,), (down,), (gate, up) = (f.parts for f in forms)
        return qkv, o, gate, up, down
    if any(m.short is None for m in plain) or gated.short is None or len(gated.short) != 2:
        return None
    p_qkv, p_o, p_down = (m.short[0] for m in plain if m.short is not None)
    p_gate, p_up = gated.short
    watched += [(attn.qkv_proj, "weight", p_qkv.tensor), (attn.o_proj, "weight", p_o.tensor)]
    watched += [(mlp.down_proj, "weight", p_down.tensor)]
    watched += [(gated, "gate", p_gate.tensor), (gated, "up", p_up.tensor)]
    return p_qkv, p_o, p_gate, p_up, p_down


def _layer(layer: DecoderLayer, watched: Watched) -> LayerWeights | None:
    attn = layer.self_attn
    projections = _projections(layer, watched)
    if projections is None:
        return None
    qkv, o, gate, up, down = projections
    for norm in (layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm):
        if norm is not None:  # the plan reads the norms' own tensors
            watched.append((norm, "weight", norm.weight))
    q_norm = None if attn.q_norm is None else attn.q_norm.weight.detach()
    k_norm = None if attn.k_norm is None else attn.k_norm.weight.detach()
    bias = attn.qkv_proj.bias
    return LayerWeights(
        in_norm=layer.input_layernorm.weight.detach(), qkv=qkv,
        qkv_bias=None if bias is None else bias.detach(), q_norm=q_norm, k_norm=k_norm, o=o,
        post_norm=layer.post_attention_layernorm.weight.detach(), gate=gate, up=up, down=down,
    )  # fmt: skip


def short_path(model: DecoderModel) -> ShortPath | None:
    """The model's short steps natively, where every layer's projections read their packed
    weights on the short-rows kernels and the native loop built here for the dtype; else None."""
    layers = [cast(DecoderLayer, m) for m in model.layers]
    if not layers:
        return None
    dtype = layers[0].input_layernorm.weight.dtype
    if not short_forward.available(dtype):
        return None
    watched: Watched = []
    weights = [_layer(layer, watched) for layer in layers]
    if any(w is None for w in weights):
        return None
    cfg = model.config
    shapes = Shapes(
        cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
        cfg.intermediate_size, cfg.rms_norm_eps,
    )  # fmt: skip
    try:
        native = ShortForward(dtype, shapes, [w for w in weights if w is not None])
    except ValueError as e:
        log.warning("short steps stay layer by layer: %s", e)
        return None
    return ShortPath(native, watched)
