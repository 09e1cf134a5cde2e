"""The blocks of one decoder layer (Qwen3, Qwen2, Llama, Mistral): RMSNorm, rotary tables,
attention with fused QKV, the gated MLP, and the layer that chains them over packed rows.

Switched by config: Qwen3 normalizes q and k per head before RoPE (`qk_norm`), Qwen2 has
q/k/v bias (`qkv_bias`). fp32 / bf16 CPU rows take the native norm/RoPE kernel where it built.
The model that stacks these layers is models/decoder.py.
"""

from __future__ import annotations

import torch
from torch import nn

from embedserve.attention.cpu import causal_attention
from embedserve.attention.metadata import AttentionFn, AttentionMetadata, pieces
from embedserve.config import ModelConfig
from embedserve.kernels import norm_rope
from embedserve.models.linear import Linear, SiluGateUp


def _native_rows(x: torch.Tensor, *others: torch.Tensor | None) -> bool:
    """float32 or bfloat16 CPU rows [rows, n], with `others` (weights, rotary tables) of their
    dtype, where the native norm/RoPE kernels built and checked out."""
    return x.dim() == 2 and norm_rope.native_for(x, *others)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, cast back before the weight (as Hugging Face does).
    float32 and bfloat16 rows on the CPU take the native kernel (one pass instead of five ops)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _native_rows(x, self.weight) and norm_rope.takes_rows(x):
            return norm_rope.add_rms_norm(x, None, self.weight, self.eps)
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """x += residual (in place), then the norm of x."""
        if _native_rows(x, self.weight) and norm_rope.takes_rows(x) and residual.is_contiguous():
            return norm_rope.add_rms_norm(x, residual, self.weight, self.eps)
        return self(x.add_(residual))


class Rotary:
    """Rotary position embedding (rotate-half layout), tables built in float32 per step."""

    def __init__(self, head_dim: int, theta: float) -> None:
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
        self.inv_freq = 1.0 / (theta**exponent)  # [head_dim / 2]

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq.to(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, head_dim]
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, head_dim]; cos/sin: [T, 1, head_dim]."""
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, attend: AttentionFn) -> None:
        super().__init__()
        self.attend = attend  # the device's route, chosen once when the model is built
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        # q, k and v share one fused projection: one matmul instead of three.
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = self.head_dim**-0.5

    def project(
        self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [T, hidden] -> q [T, heads, d], k and v [T, kv_heads, d], RoPE applied."""
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        cos, sin = cos_sin
        norms = None  # Qwen3's q/k norm weights
        if self.q_norm is not None and self.k_norm is not None:
            norms = (self.q_norm.weight, self.k_norm.weight)
        if _native_rows(qkv, cos, sin, *(norms or ())) and qkv.is_contiguous():  # in place, one pass
            eps = self.q_norm.eps if self.q_norm is not None else 0.0
            norm_rope.qk_norm_rope(qkv, self.num_heads, self.num_kv_heads, norms, cos[:, 0], sin[:, 0], eps)
            return q, k, v
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # per head, before RoPE (Qwen3)
        return Rotary.apply(q, cos, sin), Rotary.apply(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The attention output of every row, or of `rows` only (all rows' K/V still reach
        the cache: the output projection is what is spared)."""
        q, k, v = self.project(x, cos_sin)
        out = self.attend(q, k, v, kv_cache, meta, self.scale)
        return self.o_proj(out if rows is None else out.index_select(0, rows))

    def store_kv(
        self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], kv: torch.Tensor, start: int
    ) -> torch.Tensor:
        """One chunk of a sequence whose K/V sit in a contiguous buffer: writes the chunk's
        K/V at start .. start+T-1 and returns its queries [T, heads, d].

        kv: [2, kv_heads, prompt_len, d] (head-major: attention reads each head's keys as one
        dense block), positions 0 .. start-1 already filled at this layer.
        """
        q, k, v = self.project(x, cos_sin)
        end = start + q.shape[0]
        kv[0, :, start:end], kv[1, :, start:end] = k.transpose(0, 1), v.transpose(0, 1)
        return q

    def attend_buffered(
        self, q: torch.Tensor, kv: torch.Tensor, end: int, deterministic_chunk: int | None = None
    ) -> torch.Tensor:
        """Queries for positions end-len(q) .. end-1 over the buffer's keys 0 .. end-1, causal;
        `deterministic_chunk` (deterministic mode): one attention call per piece of positions cut at its
        multiples, as the chunked path makes them."""
        start = end - q.shape[0]
        parts = [
            causal_attention(
                q[p0 - start : p0 - start + m],
                kv[0, :, : p0 + m],
                kv[1, :, : p0 + m],
                self.scale,
                invariant=deterministic_chunk is not None,
            )
            for p0, m in pieces(start, q.shape[0], deterministic_chunk)
        ]
        return self.o_proj(parts[0] if len(parts) == 1 else torch.cat(parts))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = SiluGateUp(cfg.hidden_size, cfg.intermediate_size)  # silu(gate) * up
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, attend: AttentionFn) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, attend)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    # Both forwards update x in place (the residual stream) and return it: the layer's
    # input is never read again, and fresh [T, hidden] tensors per add cost page faults.
    # Given the rows that are read after this layer (the model's last layer: the pooled
    # rows), every row's K/V is still stored but only those rows run the output projection,
    # the MLP (and in the buffered form, attention): the rest of the layer's work is unused.
    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [T, hidden] -> the layer's output, [T, hidden] or [len(rows), hidden]."""
        attn = self.self_attn(self.input_layernorm(x), cos_sin, kv_cache, meta, rows)
        if rows is not None:
            x = x.index_select(0, rows)
        h = self.post_attention_layernorm.add_forward(x, attn)
        del attn  # freed before the MLP's buffers
        return x.add_(self.mlp(h))

    def forward_buffered(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv: torch.Tensor,
        start: int,
        keep: slice | None = None,
        deterministic_chunk: int | None = None,
    ) -> torch.Tensor:
        """x: rows start .. start+T-1 of a sequence whose K/V this layer keeps in `kv`
        (see `Attention.store_kv`); returns x[keep], updated in place. `deterministic_chunk`: see
        `Attention.attend_buffered`."""
        q = self.self_attn.store_kv(self.input_layernorm(x), cos_sin, kv, start)
        if keep is not None:
            lo, hi, _ = keep.indices(x.shape[0])
            x, q = x[lo:hi], q[lo:hi]
            if lo >= hi:
                return x
            start += lo
        h = self.post_attention_layernorm.add_forward(
            x, self.self_attn.attend_buffered(q, kv, start + len(q), deterministic_chunk)
        )
        del q  # a view that keeps the whole QKV output alive: freed before the MLP's buffers
        return x.add_(self.mlp(h))
