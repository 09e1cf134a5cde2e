"""What every model format yields: config, pooling, prompts, limits, weights and a tokenizer.

A Hugging Face directory (`loader.ModelFiles`) and a GGUF file (`gguf.GGUFModel`) both
produce a ModelSource, so the engine builds either the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer as HFTokenizer

from embedserve.config import ModelConfig, PoolingConfig, PoolingMethod
from embedserve.errors import ModelLoadError

if TYPE_CHECKING:  # weights are tensors; a source's config and tokenizer are read without torch
    import torch

    from embedserve.models.qwen3_vl.spec import Qwen3VLSpec


@dataclass(frozen=True, kw_only=True)
class ModelSource(ABC):
    path: Path
    model: ModelConfig
    pooling: PoolingConfig
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    max_seq_length: int | None = None
    sliding_window: int | None = None
    multimodal: Qwen3VLSpec | None = None  # a Qwen3-VL directory: tower, M-RoPE, image preprocessing
    query_encoder: Path | None = None  # inference-free SPLADE: the static query module's folder
    lexical_head: Path | None = None  # BGE-M3: sparse_linear.pt, its lexical weights (sparse vectors)
    multivector: Path | None = None  # a multi-vector model's directory (models/multivector.py)

    @abstractmethod
    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(Hugging Face parameter name, tensor) pairs, read lazily."""

    @abstractmethod
    def tokenizer(self) -> HFTokenizer:
        """The model's tokenizer, post-processor (special tokens) included."""


def default_pooling(model: ModelConfig) -> PoolingConfig:
    """Without sentence-transformers files: decoders read the last token, encoders average."""
    last = model.is_causal or model.causal_mask  # a causal Gemma3 runs whole inputs, still causal
    return PoolingConfig(method=PoolingMethod.LAST if last else PoolingMethod.MEAN, normalize=True)


def override_pooling(base: PoolingConfig, pooling: str | None, normalize: bool | None) -> PoolingConfig:
    """The caller's `pooling=` / `normalize=` options win over what the files say."""
    method = base.method
    if pooling is not None:
        try:
            method = PoolingMethod(pooling)
        except ValueError:
            choices = ", ".join(m.value for m in PoolingMethod)
            raise ModelLoadError(f"unknown pooling {pooling!r}; choose one of {choices}") from None
    if (method is PoolingMethod.SPLADE) != (base.method is PoolingMethod.SPLADE):
        raise ModelLoadError(
            "SPLADE pooling is a SparseEncoder directory's own (its SpladePooling module): it is "
            f"neither chosen for nor replaced on another model (pooling {method.value!r} asked, the "
            f"model's is {base.method.value!r})"
        )
    norm = base.normalize if normalize is None else normalize
    return replace(base, method=method, normalize=norm)
