"""Frozen configuration records shared by the engine's components."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from embedserve.lora.settings import LoraSettings

if TYPE_CHECKING:  # records name dtypes and devices; reading a model's files needs no torch
    import torch


class PoolingMethod(str, enum.Enum):
    LAST = "lasttoken"
    MEAN = "mean"
    CLS = "cls"
    SPLADE = "splade"  # every token's masked-LM term weights, folded (models/sparse_head.py)


@dataclass(frozen=True)
class ModelConfig:
    """Architecture numbers read from `config.json` (HF naming kept where it helps grepping)."""

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    qkv_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool = False
    is_causal: bool = True
    # Encoders (BERT family) only: post-LN eps, segment-embedding rows, and where absolute
    # position ids start (RoBERTa counts from padding_idx + 1, BERT from 0).
    layer_norm_eps: float = 1e-12
    type_vocab_size: int = 0
    position_offset: int = 0
    # MPNet: rows of its relative position bias table (shared by every layer; transformers
    # buckets into the first 32: models/relative_bias.py); 0: none
    relative_attention_buckets: int = 0
    # *ForSequenceClassification only: id2label in id order (a head of one label is a cross-encoder
    # reranker's) and config.json's problem_type (classify's activation: models/score_head.py).
    labels: tuple[str, ...] = ()
    problem_type: str | None = None
    # Gemma3 (models/gemma3.py): each layer's attention window (0: the whole sequence; w: keys
    # with |q - k| < w, causal: 0 <= q - k < w), the sliding layers' RoPE base, the score scale
    # (query_pre_attn_scalar ** -0.5), the full layers' linear RoPE factor, and whether its
    # attention is causal (it runs every input whole, as encoders do: `is_causal` stays False).
    layer_windows: tuple[int, ...] = ()
    local_rope_theta: float = 0.0
    attention_scale: float = 0.0
    rope_factor: float = 1.0
    causal_mask: bool = False
    # ModernBERT (models/modernbert.py; windows, bases and scale in the fields above): its norms'
    # and MLP's biases (none in the published models)
    norm_bias: bool = True
    mlp_bias: bool = False


@dataclass(frozen=True)
class DenseLayer:
    """One sentence-transformers `Dense` module after pooling (pooling/dense.py loads it):
    `activation(x @ W.T + b)`, in its folder's `model.safetensors` (or `pytorch_model.bin`), or,
    where `tensor` names one, that weight in the GGUF file at `path` (EmbeddingGemma's)."""

    path: str
    in_features: int
    out_features: int
    bias: bool
    activation: str  # "identity" | "tanh" | "relu" | "gelu" | "sigmoid"
    tensor: str = ""


@dataclass(frozen=True)
class PoolingConfig:
    """How hidden states become one vector (sentence-transformers semantics)."""

    method: PoolingMethod
    normalize: bool
    include_prompt: bool = True
    # SPLADE (sentence-transformers' SpladePooling): the activation ("relu" | "log1p_relu") and
    # how token weights fold ("max" | "sum"); None for dense poolings.
    splade: tuple[str, str] | None = None
    # sentence-transformers Dense modules between pooling and Normalize (EmbeddingGemma's
    # 768 -> 3072 -> 768); Matryoshka `dimensions` slice after the last one.
    dense: tuple[DenseLayer, ...] = ()

    def output_size(self, hidden_size: int) -> int:
        """The pooled vector's width after the Dense modules."""
        return self.dense[-1].out_features if self.dense else hidden_size

    def vector_size(self, model: ModelConfig) -> int:
        """A single vector's width: a SPLADE model's vocabulary, else the hidden size or the last
        Dense module's."""
        return model.vocab_size if self.splade is not None else self.output_size(model.hidden_size)


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    kv_cache_memory: int | None = None  # bytes; None = enough for max_num_seqs full prompts
    # Blocks the KV cache holds (an encoder's only count the tokens in flight); 0 until sized,
    # e.g. from gpu_memory_utilization once the weights are on the GPU.
    num_blocks: int = 0
    # Full blocks of computed prompts kept for requests that start with the same tokens
    # (kv_cache/manager.py); off for encoders, images and deterministic mode.
    prefix_caching: bool = False

    @property
    def max_cached_blocks(self) -> int:
        """Blocks nobody holds that the prefix cache may keep: an eighth of the cache (what it
        may add to resident memory); 0: prefix caching off."""
        return max(1, self.num_blocks // 8) if self.prefix_caching else 0


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 8192
    # Encoders attend bidirectionally, so a prompt must be computed in one step.
    allow_chunking: bool = True
    # A batch request waiting this many steps is scheduled as if it were online.
    batch_aging_steps: int = 64
    # While online work is queued, batch requests share at most this many tokens of a step
    # (None: an eighth of the budget), so the step an online query rides in stays short.
    batch_tokens_with_online: int | None = None
    # Prompts of at least this many tokens run layer-major outside the KV cache
    # (scheduler/lane.py, worker/lane_runner.py); None: every prompt goes through the scheduler.
    layer_major_tokens: int | None = None
    # Deterministic mode (docs/deterministic.md): every request's chunks are cut at multiples of
    # this many tokens (its last one excepted), whatever else shares the step; None: off.
    deterministic_chunk: int | None = None

    @property
    def batch_cap_with_online(self) -> int:
        cap = self.batch_tokens_with_online
        return max(1, self.max_num_batched_tokens // 8) if cap is None else cap

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_model_len < 1:
            raise ValueError("max_model_len must be >= 1")
        if self.batch_tokens_with_online is not None and self.batch_tokens_with_online < 1:
            raise ValueError("batch_tokens_with_online must be >= 1")
        if self.layer_major_tokens is not None and self.layer_major_tokens < 1:
            raise ValueError("layer_major_tokens must be >= 1 (0 at the engine option turns it off)")
        if self.layer_major_tokens is not None and not self.allow_chunking:
            raise ValueError("layer_major_tokens applies to decoder models only")
        if self.deterministic_chunk is not None and self.deterministic_chunk < 1:
            raise ValueError("deterministic_chunk must be >= 1")
        if self.deterministic_chunk is not None and self.max_num_batched_tokens < self.deterministic_chunk:
            raise ValueError(
                f"deterministic mode cuts chunks at multiples of {self.deterministic_chunk} tokens: "
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least that"
            )
        if not self.allow_chunking and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "this model cannot be chunked: max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) must be >= max_model_len ({self.max_model_len})"
            )


@dataclass(frozen=True)
class EngineConfig:
    model_path: str
    model: ModelConfig
    pooling: PoolingConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    dtype: torch.dtype
    device: torch.device
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    # or "rerank" (a cross-encoder or a yes/no reranker), "classify" (a *ForSequenceClassification's
    # labels); both through the score head (models/score_head.py)
    task: str = "embed"
    # Deterministic mode (docs/deterministic.md): decoders cut chunks at scheduler.deterministic_chunk;
    # encoders run every input whole in one call already, so the flag changes only the profile.
    deterministic: bool = False
    tensor_parallel_size: int = 1  # ranks the model is split across (parallel/)
    # How the model runs, resolved from the engine's options (engine/resolve.py):
    multimodal: bool = False  # images in prompts (Qwen3-VL): the multimodal runner and prompter
    rerank_kind: str | None = None  # the score head of a reranker or classifier (models/score_head.py)
    token_buckets: tuple[int, ...] | None = None  # step sizes padded to (worker/buckets.py)
    compile_backend: str | None = None  # torch.compile backend, with token buckets
    gpu_memory_utilization: float | None = None  # CUDA: the KV cache sized after loading
    max_image_pixels: int | None = None  # multimodal models' image limits; None: the defaults
    max_images_per_input: int | None = None
    lora: LoraSettings | None = None  # LoRA adapters served on these weights (lora/); None: none
    quantization: str | None = None  # "int8" / "int8-weights": the projections (engine/quantize.py)

    @property
    def vector_size(self) -> int:
        """A single vector's width: a SPLADE model's vocabulary, else the hidden size or the last
        Dense module's."""
        return self.pooling.vector_size(self.model)
