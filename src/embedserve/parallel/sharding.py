"""Megatron-style shard math for the decoders: which rows / columns of each checkpoint tensor
one rank of N holds, and the per-rank model config those shards make. Pure: no processes.

    column-parallel (rows of W [out, in] split)     row-parallel (columns split)
      q_proj, k_proj, v_proj  (+ their bias)          o_proj     (q heads)
      gate_proj, up_proj                              down_proj  (intermediate)
    vocab-parallel: embed_tokens rows, padded (see `padded_vocab`)
    replicated: every norm (input / post-attention / final, Qwen3's per-head q/k norms)

Attention heads split by rank: rank r holds query heads [r*h/N, (r+1)*h/N). Its key/value
heads are the ones those query heads read: kv/N heads each when N divides kv, else (N a
multiple of kv) the one kv head r // (N/kv), replicated on N/kv ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from embedserve.config import ModelConfig
from embedserve.errors import ModelLoadError

# A checkpoint tensor's slice: (dim, start, stop) along that dim, or None for the whole
# tensor. The embedding table's slice may run past the real vocab (its padding rows).
Slice = tuple[int, int, int] | None

VOCAB_ALIGN = 64


def padded_vocab(vocab_size: int, world: int) -> int:
    """The vocabulary padded up to a multiple of lcm(64, N).

    N: every rank holds the same number of rows, so every rank's table, lookup and all-reduce
    have one shape (collectives need equal shapes; one compiled kernel serves all ranks).
    64: the table's row count stays a multiple of the hardware's tile (GPU tensor-core / TPU
    sublane multiples; the 64 vLLM and Hugging Face's `pad_to_multiple_of` use), so sharding
    never produces a ragged tail. The padding rows are zeros no valid id looks up: ids >= the
    real vocab are refused at input validation (tokenizer/core.py), before any step."""
    align = math.lcm(VOCAB_ALIGN, world)
    return -(-vocab_size // align) * align


@dataclass(frozen=True)
class Shard:
    """One rank's part of a decoder."""

    rank: int
    world: int
    heads: int  # query heads on this rank
    kv_heads: int  # key/value heads on this rank
    kv_head_start: int  # the first of them, in the checkpoint's kv heads
    intermediate: int  # MLP columns on this rank
    vocab_rows: int  # embedding rows on this rank (padded vocab / N)
    head_dim: int

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_rows


def plan_shard(cfg: ModelConfig, world: int, rank: int) -> Shard:
    """Rank `rank` of `world`; ModelLoadError naming tensor_parallel_size when it cannot split."""
    if not cfg.is_causal:  # a causal Gemma3 runs whole inputs too (models/gemma3.py)
        what = "runs every input whole (no KV cache to split)" if cfg.causal_mask else "is an encoder"
        raise ModelLoadError(
            "tensor_parallel_size > 1 applies to decoder models (Qwen3, Qwen2, Llama, Mistral); "
            f"{cfg.architecture} {what}"
        )
    h, kv, inter = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size
    why = None
    if h % world:
        why = f"the {h} attention heads"
    elif kv % world and world % kv:
        why = f"the {kv} key/value heads (nor is it a multiple of them)"
    elif inter % world:
        why = f"intermediate_size {inter}"
    if why is not None:
        raise ModelLoadError(f"tensor_parallel_size {world} does not divide {why} of {cfg.architecture}")
    if kv >= world:
        kv_local, kv_start = kv // world, rank * (kv // world)
    else:  # fewer kv heads than ranks: each rank keeps the one its query heads read
        kv_local, kv_start = 1, rank // (world // kv)
    return Shard(
        rank=rank,
        world=world,
        heads=h // world,
        kv_heads=kv_local,
        kv_head_start=kv_start,
        intermediate=inter // world,
        vocab_rows=padded_vocab(cfg.vocab_size, world) // world,
        head_dim=cfg.head_dim,
    )


def local_config(cfg: ModelConfig, shard: Shard) -> ModelConfig:
    """The config of the model one rank builds: its heads, MLP width and embedding rows."""
    return replace(
        cfg,
        num_attention_heads=shard.heads,
        num_key_value_heads=shard.kv_heads,
        intermediate_size=shard.intermediate,
        vocab_size=shard.vocab_rows,
    )


_COLUMN_Q = ("self_attn.q_proj.",)
_COLUMN_KV = ("self_attn.k_proj.", "self_attn.v_proj.")
_COLUMN_MLP = ("mlp.gate_proj.", "mlp.up_proj.")


def tensor_slice(name: str, shard: Shard) -> Slice:
    """Which part of checkpoint tensor `name` this rank loads (None: all of it)."""
    d = shard.head_dim
    if name.endswith("embed_tokens.weight"):
        return 0, shard.vocab_start, shard.vocab_start + shard.vocab_rows
    if any(k in name for k in _COLUMN_Q):  # weight [h*d, hidden] or bias [h*d]
        return 0, shard.rank * shard.heads * d, (shard.rank + 1) * shard.heads * d
    if any(k in name for k in _COLUMN_KV):
        return 0, shard.kv_head_start * d, (shard.kv_head_start + shard.kv_heads) * d
    if any(k in name for k in _COLUMN_MLP):
        return 0, shard.rank * shard.intermediate, (shard.rank + 1) * shard.intermediate
    if "self_attn.o_proj." in name:  # [hidden, h*d]: the columns of this rank's heads
        return 1, shard.rank * shard.heads * d, (shard.rank + 1) * shard.heads * d
    if "mlp.down_proj." in name:  # [hidden, intermediate]
        return 1, shard.rank * shard.intermediate, (shard.rank + 1) * shard.intermediate
    return None


def check_row_parallel_bias(name: str) -> None:
    """A row-parallel bias would be added once per rank before the all-reduce: none of the
    supported decoders has one, so refuse rather than add it N times."""
    if name.endswith(".bias") and ("self_attn.o_proj." in name or "mlp.down_proj." in name):
        raise ModelLoadError(
            f"{name}: a bias on a row-parallel projection is not supported with tensor parallelism"
        )
