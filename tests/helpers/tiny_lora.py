"""Random PEFT LoRA adapters of tiny base models, and PEFT itself as the reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

DECODER_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ENCODER_TARGETS = ["query", "key", "value", "dense"]  # attention and both feed-forward projections


def make_adapter(base: Path, dst: Path, r: int, targets: list[str], seed: int, **config: Any) -> Path:
    """A LoRA adapter of `base` with random A and B (PEFT's own init leaves B zero: no update)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    torch.manual_seed(seed)
    model = get_peft_model(
        AutoModel.from_pretrained(base),
        LoraConfig(r=r, lora_alpha=config.pop("lora_alpha", 2 * r), target_modules=targets, **config),
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.6 / r**0.5))
    model.save_pretrained(dst)
    return dst


def peft_embed(
    base: Path,
    adapter: Path | None,
    seqs: list[list[int]],
    pooling: str = "lasttoken",
    normalize: bool = True,
) -> np.ndarray:
    """transformers + peft in float32, each sequence alone, pooled the sentence-transformers way."""
    from peft import PeftModel
    from transformers import AutoModel

    model: Any = AutoModel.from_pretrained(base, attn_implementation="sdpa").eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter).eval()
    out = []
    with torch.inference_mode():
        for ids in seqs:
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0].float()
            v = hidden[-1] if pooling == "lasttoken" else hidden.mean(0) if pooling == "mean" else hidden[0]
            out.append((torch.nn.functional.normalize(v, dim=-1) if normalize else v).numpy())
    return np.stack(out)
