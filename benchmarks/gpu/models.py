"""Random-weight Qwen3-Embedding-shaped models, made directly on the device (no download).

One seeded stream of tensors feeds both sides, so the embedserve engine (bf16) and the
Hugging Face reference (fp32) hold the same weights:

    random_weights(shape, seed, device) -> (HF parameter name, fp32 tensor) ...
        |-- RandomSource.weights()  -> embedserve DecoderModel (fused q|k|v, gate|up; bf16)
        |-- build_hf_model(...)     -> transformers Qwen3Model (fp32 reference / bf16 baseline)

Every tensor is rounded to bf16 first: the checkpoint a user serves is bf16, and the fp32
reference then computes on exactly the numbers the bf16 engine holds. Scales keep the
36-layer residual stream well-conditioned and attention far from uniform (q/k norm weights
around 1.3 give attention logits with a standard deviation near 1.7).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from embedserve.config import PoolingConfig, PoolingMethod
from embedserve.models.registry import model_config_from_hf
from embedserve.models.source import ModelSource


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int = 40960
    rope_theta: float = 1e6

    def hf_config(self) -> dict[str, Any]:
        """config.json of this shape (the published Qwen3-Embedding numbers)."""
        return {
            "architectures": ["Qwen3Model"],
            "model_type": "qwen3",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_positions,
            "rms_norm_eps": 1e-6,
            "rope_theta": self.rope_theta,  # older transformers read this, newer the dict below
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "hidden_act": "silu",
            "attention_bias": False,
            "tie_word_embeddings": False,
        }

    def flops_per_token(self, length: int) -> float:
        """Forward FLOPs per token of a `length`-token causal input (matmuls and attention).

        Linear: 2 x (q, k, v, o, gate, up, down weights) per layer. Attention: QK^T and PV each
        2 x heads x head_dim per (query, key) pair; a causal input has (length + 1) / 2 keys per
        query on average. Qwen3-Embedding-8B at 16,384 tokens: ~13.9 + ~4.8 = ~18.7 GFLOP.
        """
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        linear = 2 * (self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate)
        attention = 2 * 2 * q * (length + 1) / 2
        return float(self.layers * (linear + attention))


SHAPES: dict[str, Shape] = {
    "qwen3-8b": Shape("Qwen3-Embedding-8B", 4096, 36, 32, 8, 128, 12288, 151665),
    "qwen3-0.6b": Shape("Qwen3-Embedding-0.6B", 1024, 28, 16, 8, 128, 3072, 151669, max_positions=32768),
    # CPU smoke: the same code path at a size a 2-core machine runs in seconds.
    "tiny": Shape("tiny-qwen3", 64, 2, 4, 2, 16, 128, 4096),
    "tiny2": Shape("tiny-qwen3-b", 32, 2, 2, 1, 16, 64, 4096),
}


def _scale(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """(mean, std) of a parameter's random values."""
    if name.endswith(("q_norm.weight", "k_norm.weight")):
        return 1.3, 0.1  # sharper attention than unit norms give
    if "norm" in name:
        return 1.0, 0.1
    if "embed_tokens" in name:
        return 0.0, 1.0
    return 0.0, shape[-1] ** -0.5  # unit gain for projections: fan_in = last dim


def parameter_shapes(shape: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """HF Qwen3Model parameter names and shapes, read off a meta-device instance."""
    from transformers import AutoConfig, AutoModel

    auto: Any = AutoModel  # untyped in transformers

    config = AutoConfig.for_model(**shape.hf_config())
    with torch.device("meta"):
        model = auto.from_config(config)
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def random_weights(shape: Shape, seed: int, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """The seeded weight stream: tensor i is drawn from its own generator (seed + i)."""
    for i, (name, dims) in enumerate(parameter_shapes(shape)):
        gen = torch.Generator(device=device).manual_seed(seed + i)
        mean, std = _scale(name, dims)
        t = torch.randn(dims, generator=gen, device=device).mul_(std).add_(mean)
        yield name, t.to(torch.bfloat16).float()


def _word_tokenizer() -> HFTokenizer:
    # Inputs here are token ids; the engine only needs a tokenizer object to exist.
    tok = HFTokenizer(WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    return tok


@dataclass(frozen=True, kw_only=True)
class RandomSource(ModelSource):
    """A ModelSource whose weights come from `random_weights` on `device`."""

    shape: Shape
    seed: int
    device: torch.device
    max_len: int = field(default=16384)

    @classmethod
    def create(cls, shape: Shape, seed: int, device: torch.device, max_len: int) -> RandomSource:
        return cls(
            path=Path(f"random:{shape.name}:seed{seed}"),
            model=model_config_from_hf(shape.hf_config()),
            pooling=PoolingConfig(PoolingMethod.LAST, normalize=True),
            max_seq_length=max_len,
            shape=shape,
            seed=seed,
            device=device,
            max_len=max_len,
        )

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return random_weights(self.shape, self.seed, self.device)

    def tokenizer(self) -> HFTokenizer:
        return _word_tokenizer()


def build_hf_model(shape: Shape, seed: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """transformers Qwen3Model (SDPA attention) with the seeded weights, created on `device`."""
    from transformers import AutoConfig, AutoModel

    auto: Any = AutoModel  # untyped in transformers

    config = AutoConfig.for_model(**shape.hf_config())
    with torch.device(device):
        model = auto.from_config(config, dtype=dtype, attn_implementation="sdpa")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in random_weights(shape, seed, device):
            params[name].copy_(t)
    return model.eval()
