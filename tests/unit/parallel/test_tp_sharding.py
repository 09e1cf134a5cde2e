"""Tensor-parallel shard math (parallel/sharding.py): padding, head placement, and that the
ranks' slices put back together are exactly the checkpoint's tensors."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from embedserve.config import ModelConfig
from embedserve.errors import ModelLoadError
from embedserve.parallel.sharding import local_config, padded_vocab, plan_shard, tensor_slice

CFG = ModelConfig(
    architecture="Qwen3Model",
    model_type="qwen3",
    vocab_size=151669,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=128,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    qkv_bias=False,
    qk_norm=True,
)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_padded_vocab_is_the_smallest_multiple_of_lcm_64_n(world: int) -> None:
    align = math.lcm(64, world)
    for vocab in (1, 63, 64, 65, 151665, 151669):
        padded = padded_vocab(vocab, world)
        assert padded % align == 0 and padded % 64 == 0 and padded % world == 0
        assert vocab <= padded < vocab + align


def test_kv_heads_split_or_replicated() -> None:
    split = [plan_shard(CFG, 2, r) for r in range(2)]  # 2 kv heads over 2 ranks: one each
    assert [(s.heads, s.kv_heads, s.kv_head_start) for s in split] == [(2, 1, 0), (2, 1, 1)]
    rep = [plan_shard(CFG, 4, r) for r in range(4)]  # 2 kv heads over 4 ranks: each kept twice
    assert [(s.heads, s.kv_heads, s.kv_head_start) for s in rep] == [
        (1, 1, 0),
        (1, 1, 0),
        (1, 1, 1),
        (1, 1, 1),
    ]
    # the kv head a rank keeps is the one its query heads read (GQA group = heads / kv heads)
    group = CFG.num_attention_heads // CFG.num_key_value_heads
    for s in rep:
        first_q = s.rank * s.heads
        assert {q // group for q in range(first_q, first_q + s.heads)} == {s.kv_head_start}


@pytest.mark.parametrize(
    ("change", "world", "names"),
    [
        ({}, 3, "the 4 attention heads"),
        ({"num_attention_heads": 6, "num_key_value_heads": 6}, 4, "the 6 attention heads"),
        ({"num_attention_heads": 12, "num_key_value_heads": 4}, 3, "key/value heads"),
        ({"intermediate_size": 130}, 4, "intermediate_size 130"),
    ],
)
def test_a_size_that_does_not_divide_is_refused_naming_it(
    change: dict[str, int], world: int, names: str
) -> None:
    with pytest.raises(ModelLoadError, match=f"tensor_parallel_size {world} does not divide.*{names}"):
        plan_shard(replace(CFG, **change), world, 0)


def test_encoders_are_refused() -> None:
    with pytest.raises(ModelLoadError, match=r"decoder models.*encoder"):
        plan_shard(replace(CFG, architecture="BertModel", is_causal=False), 2, 0)


def _full(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape) + hash(name) % 97


def _take(t: torch.Tensor, part: tuple[int, int, int] | None) -> torch.Tensor:
    if part is None:
        return t
    dim, lo, hi = part
    return t.narrow(dim, min(lo, t.shape[dim]), min(hi, t.shape[dim]) - min(lo, t.shape[dim]))


@pytest.mark.parametrize(("kv", "world"), [(2, 2), (1, 2), (2, 4), (4, 2)])
def test_slices_reassemble_the_checkpoint(kv: int, world: int) -> None:
    cfg = replace(CFG, num_key_value_heads=kv, num_attention_heads=4 if kv < 4 else 8)
    d, h, inter = cfg.head_dim, cfg.num_attention_heads, cfg.intermediate_size
    shapes = {
        "model.embed_tokens.weight": (cfg.vocab_size, 64),
        "model.layers.0.self_attn.q_proj.weight": (h * d, 64),
        "model.layers.0.self_attn.q_proj.bias": (h * d,),
        "model.layers.0.self_attn.k_proj.weight": (kv * d, 64),
        "model.layers.0.self_attn.v_proj.bias": (kv * d,),
        "model.layers.0.self_attn.o_proj.weight": (64, h * d),
        "model.layers.0.mlp.gate_proj.weight": (inter, 64),
        "model.layers.0.mlp.down_proj.weight": (64, inter),
        "model.layers.0.self_attn.q_norm.weight": (d,),
        "model.norm.weight": (64,),
    }
    shards = [plan_shard(cfg, world, r) for r in range(world)]
    local = local_config(cfg, shards[0])
    assert local.vocab_size * world == padded_vocab(cfg.vocab_size, world)
    for name, shape in shapes.items():
        full = _full(name, shape)
        parts = [(tensor_slice(name, s), s) for s in shards]
        if parts[0][0] is None:  # replicated
            assert all(p is None for p, _ in parts), name
            continue
        dim = parts[0][0][0]
        if "k_proj" in name or "v_proj" in name:  # each distinct kv head once, in order
            heads = sorted({(s.kv_head_start, s.kv_heads) for _, s in parts})
            got = torch.cat([full.narrow(0, a * d, n * d) for a, n in heads])
        else:
            got = torch.cat([_take(full, p) for p, _ in parts], dim=dim)
        assert torch.equal(got, full), name
