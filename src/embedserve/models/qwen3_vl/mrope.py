"""Interleaved M-RoPE (Qwen3-VL): one rotary table whose frequencies read three position rows.

Frequency i of the head_dim / 2 takes its angle from the
    h row  where i % 3 == 1 and i < 3 * section_h,
    w row  where i % 3 == 2 and i < 3 * section_w,
    t row  everywhere else;
the table is then the usual rotate-half [freqs | freqs]. Text tokens have t == h == w, so their
table is plain RoPE's: a text-only step takes the 1-D path and gives identical numbers.
"""

from __future__ import annotations

import torch

from embedserve.models.decoder_layer import Rotary


class MRotary(Rotary):
    def __init__(self, head_dim: int, theta: float, section: tuple[int, int, int]) -> None:
        super().__init__(head_dim, theta)
        if sum(section) != head_dim // 2:
            raise ValueError(f"mrope_section {list(section)} must sum to head_dim / 2 = {head_dim // 2}")
        half = head_dim // 2
        axis = torch.zeros(half, dtype=torch.long, device="cpu")  # which position row each frequency reads
        for row, offset in ((1, 1), (2, 2)):
            axis[offset : section[row] * 3 : 3] = row
        self.axis = axis

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] (text: plain RoPE) or [3, T] (t, h, w) -> cos, sin [T, 1, head_dim]."""
        if positions.dim() == 1:
            return super().cos_sin(positions, dtype)
        inv = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, :, None] * inv[None, None, :]  # [3, T, head_dim / 2]
        axis = self.axis.to(positions.device)
        picked = freqs.gather(0, axis.view(1, 1, -1).expand(1, freqs.shape[1], -1))[0]  # [T, head_dim / 2]
        emb = torch.cat((picked, picked), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]
