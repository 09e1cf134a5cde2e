"""Qwen3-VL's vision tower: patches -> [main | deepstack_1 .. deepstack_k] rows, one per token.

pixels [N, C*T*P*P] --linear (the Conv3d, kernel == stride)--> [N, d]
  + learned position table bilinearly resampled to the image's grid
blocks: LayerNorm -> attention (2-D rotary over (row, col), bidirectional within one image)
        -> LayerNorm -> MLP (tanh GELU)
after block deepstack_visual_indexes[j]: deepstack merger j  (LayerNorm over m*m*d)
after the last block:                    merger              (LayerNorm over d)
a merger: m x m neighbouring patches (consecutive rows: patches come in merge-block order)
          -> [N / m^2, m^2 d] -> fc1 -> GELU (erf) -> fc2 -> [N / m^2, text hidden]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional

from embedserve.models.linear import Linear

if TYPE_CHECKING:
    from embedserve.models.qwen3_vl.spec import VisionSpec


class _MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str) -> None:
        super().__init__()
        self.linear_fc1 = Linear(dim, hidden, bias=True)
        self.linear_fc2 = Linear(hidden, dim, bias=True)
        self.approximate = "tanh" if act == "gelu_pytorch_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(functional.gelu(self.linear_fc1(x), approximate=self.approximate))


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = Linear(dim, 3 * dim, bias=True)
        self.proj = Linear(dim, dim, bias=True)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]
    ) -> torch.Tensor:
        """x: [N, d] (images one after another, `lengths` patches each); cos/sin: [N, head_dim]."""
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.heads, -1).unbind(1)  # [N, heads, hd] each
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        outs = []
        for qi, ki, vi in zip(
            torch.split(q, lengths), torch.split(k, lengths), torch.split(v, lengths), strict=True
        ):
            o = functional.scaled_dot_product_attention(
                qi.transpose(0, 1), ki.transpose(0, 1), vi.transpose(0, 1)
            )  # [heads, n_i, hd], every patch sees its whole image
            outs.append(o.transpose(0, 1).reshape(qi.shape[0], -1))
        return self.proj(torch.cat(outs) if len(outs) > 1 else outs[0])


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE in float32 (as the reference), back to x's dtype."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class _Block(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(spec.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(spec.hidden_size, eps=1e-6)
        self.attn = _Attention(spec.hidden_size, spec.num_heads)
        self.mlp = _MLP(spec.hidden_size, spec.intermediate_size, spec.hidden_act)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, lengths)
        return x + self.mlp(self.norm2(x))


class _Merger(nn.Module):
    def __init__(self, spec: VisionSpec, postshuffle_norm: bool) -> None:
        super().__init__()
        self.unit = spec.spatial_merge_size**2
        merged = spec.hidden_size * self.unit
        self.postshuffle_norm = postshuffle_norm
        self.norm = nn.LayerNorm(merged if postshuffle_norm else spec.hidden_size, eps=1e-6)
        self.linear_fc1 = Linear(merged, merged)
        self.linear_fc2 = Linear(merged, spec.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, d] patches in merge-block order -> [N / m^2, out]."""
        d = x.shape[-1]
        x = self.norm(x.reshape(-1, d * self.unit)) if self.postshuffle_norm else self.norm(x)
        x = x.reshape(-1, d * self.unit)
        return self.linear_fc2(functional.gelu(self.linear_fc1(x)))


class PatchEmbed(nn.Module):
    """The Conv3d patch embedding (kernel == stride == one patch) as a linear map over flat patches;
    the checkpoint's [d, C, T, P, P] weight is loaded as [d, C*T*P*P]."""

    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        flat = spec.in_channels * spec.temporal_patch_size * spec.patch_size**2
        self.proj = Linear(flat, spec.hidden_size, bias=True)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.proj(pixels)


class VisionTower(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.spec = spec
        self.patch_embed = PatchEmbed(spec)
        self.pos_embed = nn.Embedding(spec.num_position_embeddings, spec.hidden_size)
        self.side = int(spec.num_position_embeddings**0.5)
        self.blocks = nn.ModuleList(_Block(spec) for _ in range(spec.depth))
        self.merger = _Merger(spec, postshuffle_norm=False)
        self.deepstack_merger_list = nn.ModuleList(
            _Merger(spec, postshuffle_norm=True) for _ in spec.deepstack_visual_indexes
        )
        head_dim = spec.hidden_size // spec.num_heads
        quarter = head_dim // 2
        exponent = torch.arange(0, quarter, 2, dtype=torch.float, device="cpu") / quarter  # not "meta"
        self.inv_freq = 1.0 / (spec.rope_theta**exponent)

    def forward(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """pixels [N, C*T*P*P] of the images in `grids` order -> [N / m^2, out * (1 + k)]:
        each token's main row, then its k deepstack rows."""
        dtype = self.patch_embed.proj.weight.dtype
        rows, cols = _patch_coords(grids, self.spec.spatial_merge_size, pixels.device)
        x = self.patch_embed(pixels.to(dtype))
        x = x + self._positions(rows, cols, grids).to(dtype)
        freqs_h = rows.float()[:, None] * self.inv_freq.to(pixels.device)[None]
        freqs_w = cols.float()[:, None] * self.inv_freq.to(pixels.device)[None]
        half = torch.cat((freqs_h, freqs_w), dim=-1)
        emb = torch.cat((half, half), dim=-1)  # [N, head_dim]
        cos, sin = emb.cos(), emb.sin()
        lengths = [t * h * w for t, h, w in grids]
        deep: list[torch.Tensor] = []
        indexes = self.spec.deepstack_visual_indexes
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, lengths)
            if i in indexes:
                deep.append(self.deepstack_merger_list[indexes.index(i)](x))
        return torch.cat([self.merger(x), *deep], dim=-1)

    def _positions(
        self, rows: torch.Tensor, cols: torch.Tensor, grids: list[tuple[int, int, int]]
    ) -> torch.Tensor:
        """The learned square position table resampled to each image's grid (bilinear,
        align_corners=True), per patch: [N, d] float32."""
        heights = torch.cat([torch.full((t * h * w,), h) for t, h, w in grids]).to(rows.device)
        widths = torch.cat([torch.full((t * h * w,), w) for t, h, w in grids]).to(rows.device)
        side = self.side
        r_taps, r_w = _taps(rows, heights, side)
        c_taps, c_w = _taps(cols, widths, side)
        index = (r_taps[:, :, None] * side + c_taps[:, None, :]).reshape(-1, 4)
        weight = (r_w[:, :, None] * c_w[:, None, :]).reshape(-1, 4)
        return (self.pos_embed(index) * weight[:, :, None]).sum(1)


def _taps(index: torch.Tensor, size: torch.Tensor, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear taps (floor, floor + 1) into a `side`-long axis and their weights, for target
    positions `index` on an axis of `size` (align_corners=True: the ends map to 0 and side-1)."""
    src = index.float() * (side - 1) / torch.clamp(size - 1, min=1).float()
    floor = torch.floor(src)
    offsets = torch.arange(2, device=index.device)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


def _patch_coords(
    grids: list[tuple[int, int, int]], merge: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) of every patch, in merge-block order (block row, block col, in-row, in-col)."""
    rows, cols = [], []
    for t, h, w in grids:
        r = torch.arange(h).view(h // merge, merge, 1, 1).expand(h // merge, merge, w // merge, merge)
        c = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, w // merge, merge)
        rows.append(r.transpose(1, 2).reshape(-1).repeat(t))
        cols.append(c.transpose(1, 2).reshape(-1).repeat(t))
    return torch.cat(rows).to(device), torch.cat(cols).to(device)
