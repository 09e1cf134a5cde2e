"""`embedserve` command line: one subcommand per tool."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from embedserve.bench.cli import register as register_bench
from embedserve.engine.options import EngineOptions, add_engine_options
from embedserve.errors import EmbedServeError, InputTooLongError
from embedserve.gateway.cli import register as register_gateway
from embedserve.index.cli import register as register_index
from embedserve.parity.cli import register as register_parity
from embedserve.scale.cli import register as register_scale
from embedserve.server.cli import register as register_serve
from embedserve.server.run_batch import register as register_run_batch


def _cmd_embed(args: argparse.Namespace) -> int:
    from embedserve.engine.engine import Engine

    with Engine.from_pretrained(args.model, EngineOptions.from_args(args)) as engine:
        try:
            vectors = engine.embed(
                args.texts, prompt_name=args.prompt_name, dimensions=args.dimensions, truncate=args.truncate
            )
        except InputTooLongError as e:
            raise e.with_remedy("pass --truncate end / start") from None
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
    register_serve(sub)
    register_bench(sub)
    register_parity(sub)
    register_index(sub)
    register_gateway(sub)
    register_scale(sub)
    register_run_batch(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except EmbedServeError as e:
        print(f"embedserve: error: {e}", file=sys.stderr)
        return 2
