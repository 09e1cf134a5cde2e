"""Device facts, the attention route the decoder uses, and the engine under test.

The route is handed to `build_engine(attention=...)`, wrapped so it counts its calls: the
record shows whether the engine really ran it.
"""

from __future__ import annotations

import argparse
import platform
from typing import Any

import torch
from models import RandomSource, Shape

from embedserve.attention.cpu import paged_attention
from embedserve.attention.cuda import lower_right_attention
from embedserve.attention.select import NamedAttention, Route, select_attention
from embedserve.engine.builder import build_engine
from embedserve.engine.engine import Engine


class CountingRoute:
    def __init__(self, route: NamedAttention) -> None:
        self.route = route
        self.calls = 0

    def __call__(self, *args: Any) -> torch.Tensor:  # the AttentionFn arguments, passed through
        self.calls += 1
        return self.route(*args)


def counting_route(choice: str, device: torch.device) -> CountingRoute:
    if choice == "auto":
        route = select_attention(device, torch.bfloat16)
    elif choice == Route.SDPA_LOWER_RIGHT.value:
        route = NamedAttention(choice, lower_right_attention)
    else:
        route = NamedAttention(Route.CPU.value, paged_attention)
    return CountingRoute(route)


def device_facts(device: torch.device) -> dict[str, Any]:
    import transformers

    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(
            gpu=props.name,
            capability=".".join(map(str, torch.cuda.get_device_capability(device))),
            memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
        )
    else:
        facts["gpu"] = "none (CPU smoke run)"
    return facts


def make_engine(
    args: argparse.Namespace, shape: Shape, device: torch.device, max_len: int, route: CountingRoute
) -> Engine:
    """bf16 engine over the seeded random weights; KV cache from gpu_memory_utilization on CUDA."""
    memory: dict[str, Any] = (
        {"gpu_memory_utilization": args.gpu_memory_utilization} if device.type == "cuda" else {}
    )
    parts = build_engine(
        RandomSource.create(shape, args.seed, device, max_len),
        dtype="bfloat16",
        device=str(device),
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_model_len=max_len,
        token_buckets=args.buckets,
        compile_backend=args.compile,
        attention=route,
        **memory,
    )
    return Engine(parts)
