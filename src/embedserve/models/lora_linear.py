"""The projections of a model that serves LoRA adapters (lora/): `Linear` and `SiluGateUp` that
add each adapter's update on its rows of the step after their base matmul (lora/rows.py).

A model becomes one with `enable_lora`, which swaps the classes of its projections in place and
names each by its module path (the key adapters' updates are filed under). A model without it
never pays for the check. A gated MLP whose gate or up projection an adapter of the step
targets runs unfused there: the update must reach the pre-activations, before silu and the
product; the other steps keep the fused kernels.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from embedserve.lora.rows import active, add_updates
from embedserve.models.linear import Linear, SiluGateUp, _onednn_linear


class LoraLinear(Linear):
    lora_key = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        add_updates(self.lora_key, x, y)
        return y

    def padded(self, x: torch.Tensor) -> torch.Tensor:
        y = super().padded(x)
        add_updates(self.lora_key, x, y)
        return y


class LoraSiluGateUp(SiluGateUp):
    lora_key = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = active()
        if rows is None or not rows.touches(self.lora_key):
            return super().forward(x)
        n = self.intermediate
        if self.gate is not None and self.up is not None:  # packed as two halves
            gate, up = _onednn_linear(x, self.gate, None), _onednn_linear(x, self.up, None)
            add_updates(self.lora_key, x, gate, slice(0, n))
            add_updates(self.lora_key, x, up, slice(n, 2 * n))
        else:
            both = self._run(x, keep_padding=False)
            add_updates(self.lora_key, x, both)
            gate, up = both[..., :n], both[..., n:]
        return functional.silu(gate).mul_(up)


def enable_lora(model: nn.Module) -> int:
    """Make every projection of `model` apply adapters' updates; returns how many. Keys are module
    paths in `model` (e.g. layers.0.self_attn.qkv_proj)."""
    count = 0
    for name, module in model.named_modules():
        if type(module) is Linear:
            module.__class__ = LoraLinear
        elif type(module) is SiluGateUp:
            module.__class__ = LoraSiluGateUp
        else:
            continue
        module.lora_key = name
        count += 1
    return count
