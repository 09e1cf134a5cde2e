"""`embedserve parity`: exit 0 = gate passed, 1 = gate failed (metrics on stderr), 2 = could not run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from embedserve.parity.options import split_dataset_list

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2

EPILOG = """\
backends:  the spec grammar shared with bench and index (docs/specs.md):
           sentence-transformers:PATH  (reference: sentence-transformers, float32; ?dtype=...)
           hf:PATH  (reference: transformers with the directory's pooling; parity's hf: used to be
                     sentence-transformers: name that one to gate against it)
           engine:PATH?dtype=bfloat16&max_num_batched_tokens=512&...  (any EngineOptions field)
           http://HOST:PORT?model=NAME&api_key_env=VAR&tokenizer=MODEL_DIR  (OpenAI-compatible)
datasets:  pydocs | passkey | needle | random-tokens  (built in, offline)
           beir:NAME  (e.g. beir:scifact: <data dir>/beir/NAME, downloaded once when missing)
           cranfield | peps | BEIR folder  (local files), each with ?options, e.g.
           pydocs?docs=20&long=6   passkey?lengths=256,1024,4096&per_length=2   cranfield?queries=50
data dir:  --data-dir, else $EMBEDSERVE_DATA_DIR, else ~/.cache/embedserve/datasets
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "parity",
        help="golden-parity release gate: reference vs candidate vectors, rankings and retrieval",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--reference", required=True, help="reference backend, e.g. hf:MODEL_DIR")
    p.add_argument("--candidate", required=True, help="candidate backend, e.g. engine:DIR?dtype=bfloat16")
    p.add_argument(
        "--dataset",
        action="append",
        default=[],
        help="NAME[,NAME...], beir:NAME or a BEIR folder (repeatable), e.g. pydocs",
    )
    p.add_argument("--scenario", choices=["preemption"], default=None, help="run a built-in scenario too")
    p.add_argument("--scenario-length", type=int, default=15_500, help="long input of the scenario (tokens)")
    p.add_argument("--scenario-seed", type=int, default=0)
    p.add_argument("--gate", default=None, help="gate YAML (default thresholds when omitted)")
    p.add_argument(
        "--gate-profile",
        default=None,
        help="gate profile: multimodal, int8 (an int8 candidate), or one of --gate's",
    )
    p.add_argument("--out", required=True, type=Path, help="folder for report.json and report.md")
    p.add_argument(
        "--data-dir",
        default=None,
        help="folder of local datasets and BEIR downloads "
        "(default: $EMBEDSERVE_DATA_DIR, else ~/.cache/embedserve/datasets)",
    )
    p.add_argument("--query-prompt", default=None, help="override the model's query prompt")
    p.add_argument("--document-prompt", default=None, help="override the model's document prompt")
    p.add_argument(
        "--reference-cache", type=Path, default=None, help="reuse reference vectors saved here before"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    g = p.add_argument_group("rerank (--task rerank: reranker scores, parity/rerank.py)")
    g.add_argument(
        "--task", choices=["embed", "rerank"], default="embed", help="compare embeddings or reranker scores"
    )
    g.add_argument("--rerank-depth", type=int, default=20, help="BM25 candidates reranked per query")
    g.add_argument("--rerank-instruction", default=None, help="Qwen3-Reranker instruction (both sides)")
    g.add_argument("--rerank-max-diff", type=float, default=1e-4, help="gate: largest score difference")
    g.add_argument("--rerank-min-tau", type=float, default=0.9, help="gate: smallest Kendall tau per query")
    p.set_defaults(func=_cmd_parity)


def _cmd_rerank(args: argparse.Namespace) -> int:
    from embedserve.parity.rerank import RerankSettings, run_rerank

    settings = RerankSettings(
        reference=args.reference,
        candidate=args.candidate,
        datasets=split_dataset_list(args.dataset),
        out=args.out,
        data_dir=args.data_dir,
        depth=args.rerank_depth,
        instruction=args.rerank_instruction,
        max_abs_diff=args.rerank_max_diff,
        min_kendall_tau=args.rerank_min_tau,
    )
    try:
        rows, failed = run_rerank(settings)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # no verdict: "could not run" (exit 2), as for embeddings
        print(f"embedserve parity: could not run: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_ERROR
    print(f"embedserve parity (rerank): {len(rows)} dataset(s); report: {args.out / 'report.md'}")
    if failed:
        print("embedserve parity: GATE FAILED", file=sys.stderr)
        for line in failed:
            print(f"  {line}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_PASS


def _cmd_parity(args: argparse.Namespace) -> int:
    if args.task == "rerank":
        return _cmd_rerank(args)
    # Imported here: the other subcommands should not pay for torch + sentence-transformers.
    from embedserve.parity.report import write_report
    from embedserve.parity.runner import Settings, run

    settings = Settings(
        reference=args.reference,
        candidate=args.candidate,
        datasets=split_dataset_list(args.dataset),
        scenario=args.scenario,
        scenario_length=args.scenario_length,
        scenario_seed=args.scenario_seed,
        gate=args.gate,
        gate_profile=args.gate_profile,
        data_dir=args.data_dir,
        query_prompt=args.query_prompt,
        document_prompt=args.document_prompt,
        reference_cache=args.reference_cache,
        progress=not args.no_progress,
    )
    try:
        outcome = run(settings)
        json_path, md_path = write_report(outcome.report, outcome.checks, args.out)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # any failure to produce a verdict is "could not run" (exit 2), by contract
        print(f"embedserve parity: could not run: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_ERROR
    failed = [c for c in outcome.checks if not c.passed]
    passed = len(outcome.checks) - len(failed)
    print(f"embedserve parity: {passed}/{len(outcome.checks)} checks passed; report: {md_path}, {json_path}")
    if failed:
        print("embedserve parity: GATE FAILED", file=sys.stderr)
        for c in failed:
            print(f"  {c.describe()}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_PASS
