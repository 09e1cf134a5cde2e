"""`embedserve bench`: the load matrix per length bucket, side by side, in one run."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from embedserve.errors import EmbedServeError, InvalidInputError


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def register(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="load matrix (target x length x concurrency x token budget) per length bucket",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--target",
        action="append",
        required=True,
        metavar="T",
        help="engine:PATH?opts | sentence-transformers:PATH?opts | hf:PATH?opts | http://HOST:PORT/v1?opts "
        "(the spec grammar shared with parity and index: docs/specs.md); repeat for side by side (ratios "
        "are to the first)",
    )
    p.add_argument("--lengths", type=_ints, default=[], help="uniform input lengths in tokens, e.g. 512,2048")
    p.add_argument("--mix", default=None, help="mixed lengths, e.g. 0-1K:0.4,1K-4K:0.3,4K-8K:0.2,8K-16K:0.1")
    p.add_argument("--concurrency", type=_ints, default=[1], help="closed-loop clients, e.g. 1,8,32")
    p.add_argument("--token-budget", type=_ints, default=[2048], help="engine max_num_batched_tokens values")
    p.add_argument("--requests", type=int, default=16, help="requests per cell")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument(
        "--scenario",
        choices=["matrix", "interference", "rerank"],
        default="matrix",
        help="rerank: reranker targets (engine:, sentence-transformers:, hf:, http://), pairs/s per length",
    )
    p.add_argument("--rerank-documents", type=int, default=32, help="documents per rerank request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--text",
        choices=["random", "pydocs", "peps"],
        default="random",
        help="random single-token words, or real text cut to length: Python's bundled docs and "
        "stdlib sources (pydocs, on every machine) or the PEPs under --data-dir (peps)",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="folder holding peps/ for --text peps (default: $EMBEDSERVE_DATA_DIR, "
        "else ~/.cache/embedserve/datasets)",
    )
    p.add_argument(
        "--tokenizer", type=Path, default=None, help="tokenizer.json (default: first local target's)"
    )
    p.add_argument(
        "--images-per-input",
        type=int,
        default=0,
        help="image mix (multimodal models; engine: and http:// targets): each input is text + N synthetic "
        "images, its length in tokens counting the image tokens",
    )
    p.add_argument("--image-size", default="448x448", help="WxH of the image mix's images")
    p.add_argument("--min-tokens", type=int, default=16, help="shortest length --mix draws")
    p.add_argument("--max-tokens", type=int, default=16384, help="longest length --mix draws")
    p.add_argument(
        "--cosine-sample",
        type=int,
        default=1,
        help="texts per length embedded unloaded for cosine to the first target (0: off)",
    )
    p.add_argument(
        "--cell-timeout",
        type=float,
        default=1800.0,
        help="seconds without progress before a worker is killed",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--threads", type=int, default=None, help="torch threads per worker (default: torch's)")
    g = p.add_argument_group("interference scenario")
    g.add_argument("--short-tokens", type=int, default=32)
    g.add_argument("--short-requests", type=int, default=40)
    g.add_argument(
        "--short-interval-ms", type=float, default=100.0, help="one short query every N ms (open loop)"
    )
    g.add_argument("--flood-min", type=int, default=8192, help="shortest flood document (tokens)")
    g.add_argument("--flood-max", type=int, default=16384, help="longest flood document (tokens)")
    g.add_argument("--flood-clients", type=int, default=4, help="closed-loop clients sending documents")
    g.add_argument(
        "--settle-s", type=float, default=0.5, help="flood head start before the first short query"
    )
    p.set_defaults(func=cmd_bench)


def config_from_args(args: argparse.Namespace) -> Any:
    from embedserve.bench.config import BenchConfig
    from embedserve.bench.images import parse_image_size
    from embedserve.bench.inputs import parse_mix
    from embedserve.bench.target import parse_target

    if args.requests < 1:
        raise InvalidInputError(f"--requests must be positive, got {args.requests}")
    return BenchConfig(
        targets=[parse_target(t) for t in args.target],
        out=args.out,
        lengths=args.lengths,
        mix=parse_mix(args.mix) if args.mix else None,
        concurrency=args.concurrency,
        token_budgets=args.token_budget,
        requests=args.requests,
        scenario=args.scenario,
        seed=args.seed,
        text=args.text,
        data_dir=args.data_dir,
        tokenizer=args.tokenizer,
        min_tokens=args.min_tokens,
        max_tokens=args.max_tokens,
        cosine_sample=args.cosine_sample,
        cell_timeout=args.cell_timeout,
        progress=not args.no_progress,
        threads=args.threads,
        short_tokens=args.short_tokens,
        short_requests=args.short_requests,
        short_interval_ms=args.short_interval_ms,
        flood_min=args.flood_min,
        flood_max=args.flood_max,
        flood_clients=args.flood_clients,
        settle_s=args.settle_s,
        images_per_input=args.images_per_input,
        image_size=parse_image_size(args.image_size),
    )


def command_line(args: argparse.Namespace) -> str:
    """A command that reruns this benchmark, rebuilt from the parsed options (defaults included)."""
    from embedserve.embedders.spec import without_secrets

    shown = [without_secrets(t) for t in args.target]  # an http target's api_key is never written
    parts = ["embedserve", "bench"] + [x for t in shown for x in ("--target", t)]
    for key, value in vars(args).items():
        if key in ("target", "func", "command") or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif isinstance(value, list):
            if value:
                parts += [flag, ",".join(map(str, value))]
        else:
            parts += [flag, str(value)]
    return shlex.join(parts)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.scenario == "rerank":
        from embedserve.bench.rerank import run_rerank_bench

        return run_rerank_bench(args)
    try:
        from embedserve.bench.machine import machine_info
        from embedserve.bench.markdown import render
        from embedserve.bench.plots import write_plots
        from embedserve.bench.report import build_rows, group_meta, interference_latencies, write_results
        from embedserve.bench.runner import run
    except ImportError as e:
        raise EmbedServeError(f"embedserve bench needs its extra ({e}): pip install -e '.[bench]'") from e

    cfg = config_from_args(args)
    machine = machine_info()
    groups, inputs = run(cfg)
    machine["load_avg_1m_end"] = machine_info()["load_avg_1m"]
    rows = build_rows(cfg, groups, inputs, machine)
    meta = {
        "command": command_line(args),
        "scenario": cfg.scenario,
        "machine": machine,
        "groups": group_meta(groups),
        "latencies": interference_latencies(groups),
    }
    write_results(cfg.out, rows, meta)
    plots = write_plots(cfg.out, rows, meta["latencies"])
    (cfg.out / "report.md").write_text(render(meta, rows, plots), encoding="utf-8")
    failed = sum(1 for g in groups if g.error)
    print(
        f"wrote {len(rows)} rows to {cfg.out} (results.csv, results.json, report.md, {len(plots)} plots)"
        + (f"; {failed} target group(s) failed, see report.md" if failed else "")
    )
    return 0
