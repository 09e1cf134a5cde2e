"""`embedserve run-batch`: a file of requests in OpenAI's batch format, answered in-process
(--model: the server's own pipeline, no HTTP) or by a server or gateway (--url), into an output
file (status 200) and an error file (anything else, with the input line number), in input order.

Resumable: run the same command again after a crash or Ctrl-C and only the lines missing from
both files are computed; lines a --url server could not be reached for (error code
`unreachable`) are taken out of the error file and sent again. A --url that answers nothing at
the start is exit 2 before any line is sent. Exit status: 0 every line answered 200; 1 some
lines are in the error file; 2 bad usage (a duplicate custom_id, a missing file, a model that
does not load, a --url that cannot be reached); 130 interrupted (what was answered is written;
run again to resume).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from embedserve.batch.format import UNREACHABLE
from embedserve.batch.resume import drop_unsent, scan, written_keys
from embedserve.engine.options import EngineOptions, add_engine_options, positive_int
from embedserve.errors import EmbedServeError

API_KEY_ENV = "EMBEDSERVE_API_KEY"
INTERRUPTED = 130


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run-batch",
        help="answer a JSONL file of requests in OpenAI's batch format (resumable)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("files")
    g.add_argument(
        "-i", "--input", required=True, type=Path, help="input JSONL: custom_id, method, url, body"
    )
    g.add_argument("-o", "--output", required=True, type=Path, help="output JSONL (appended to on resume)")
    g.add_argument(
        "--errors", type=Path, default=None, help="error JSONL (default: OUTPUT's stem + .errors.jsonl)"
    )
    r = p.add_argument_group("running")
    r.add_argument("--url", default=None, help="send the lines to this server or gateway instead of --model")
    r.add_argument(
        "--concurrency",
        type=positive_int,
        default=None,
        help="lines in flight (default: 64 in-process, 8 with --url); also the lines held in memory",
    )
    r.add_argument("--retries", type=int, default=20, help="waits per line on 429 / 503 (Retry-After)")
    r.add_argument("--served-model-name", default=None, help="--model: the name bodies' `model` may give")
    r.add_argument("--api-key", default=None, help=f"--url: the Bearer key (default: ${API_KEY_ENV})")
    r.add_argument("--timeout", type=float, default=600.0, help="--url: seconds per HTTP request")
    add_engine_options(p)
    p.set_defaults(func=_cmd_run_batch, model=None)  # None: not given (the default model, unless --url)


def errors_path(output: Path) -> Path:
    """`out.jsonl` -> `out.errors.jsonl`."""
    return output.with_name(f"{output.stem}.errors{output.suffix or '.jsonl'}")


def _cmd_run_batch(args: argparse.Namespace) -> int:
    errors = args.errors or errors_path(args.output)
    refusal = _refusal(args, errors)
    if refusal is not None:
        print(f"embedserve run-batch: error: {refusal}", file=sys.stderr)
        return 2
    try:
        listed = scan(args.input)  # a duplicate custom_id: BatchFileError, exit 2 before any work
        done = written_keys(args.output)  # both files checked (and a cut-short last line cut) first
        written_keys(errors)
        if args.url is not None:
            _reachable(args)  # Unreachable: exit 2, nothing sent and no file changed
        unsent = drop_unsent(errors, frozenset({UNREACHABLE}))
        done |= written_keys(errors)
    except KeyboardInterrupt:
        print("interrupted before any work", file=sys.stderr)
        return INTERRUPTED
    if unsent:
        print(f"sending again {unsent} lines that got no answer from {args.url} before", file=sys.stderr)
    left = len(listed.keys - done)
    if done:
        print(f"resuming: {len(listed.keys & done)} of {listed.lines} lines already written", file=sys.stderr)
    if not left:
        print(f"nothing left to do: every line of {args.input} is written", file=sys.stderr)
        return _status(errors)
    return asyncio.run(_run(args, errors, left, done))


def _refusal(args: argparse.Namespace, errors: Path) -> str | None:
    """What makes the command unusable as given (exit 2), before anything is read or loaded."""
    if args.url is not None and (args.model is not None or EngineOptions.from_args(args) != EngineOptions()):
        return "--model and engine options do not go with --url"
    if not args.input.is_file():
        return f"no input file {args.input}"
    folder = next((f.parent for f in (args.output, errors) if not f.parent.is_dir()), None)
    if folder is not None:
        return f"no folder {folder} for the output"
    if args.retries < 0:
        return "--retries must be >= 0"
    return None


def _status(errors: Path) -> int:
    return 1 if errors.exists() and errors.stat().st_size else 0


async def _run(args: argparse.Namespace, errors: Path, left: int, done: set[Any]) -> int:
    from embedserve.batch.runner import Progress, Sink, lines_left, run

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_interrupt() -> None:  # a second Ctrl-C stops at once
        print("\ninterrupted: writing the lines already answered", file=sys.stderr)
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    with contextlib.suppress(NotImplementedError, RuntimeError):  # no handler off the main thread
        loop.add_signal_handler(signal.SIGINT, on_interrupt)
    async with _executor(args) as execute:
        if stop.is_set():
            outcome = None
        else:
            sink = Sink(args.output, errors)
            progress = Progress(left)
            try:
                outcome = await run(
                    lines_left(args.input, done), execute, sink, _window(args), stop, progress
                )
            finally:
                sink.close()
    if outcome is None or outcome.interrupted:
        written = 0 if outcome is None else outcome.ok + outcome.failed
        print(
            f"stopped after {written} of {left} lines; run the same command again to compute the "
            f"{left - written} left",
            file=sys.stderr,
        )
        return INTERRUPTED
    rate = (outcome.ok + outcome.failed) / max(outcome.seconds, 1e-9)
    print(
        f"{outcome.ok} lines to {args.output}, {outcome.failed} to {errors} in {outcome.seconds:.1f} s "
        f"({rate:.1f} lines/s, {progress.tokens / max(outcome.seconds, 1e-9):.0f} tok/s)",
        file=sys.stderr,
    )
    return _status(errors)


class Unreachable(EmbedServeError):
    """The --url answered nothing at the start (cli.py: exit 2; nothing was sent)."""


def _reachable(args: argparse.Namespace) -> None:
    """Any HTTP answer from the --url (a 404 too) will do: one that answers nothing would turn
    every line into an `unreachable` error. Tried as often as a line is (--retries, 1 s apart:
    a server still starting is waited for), each connection attempt at most 10 s."""
    import httpx

    url = args.url.rstrip("/") + "/v1/models"
    timeout = httpx.Timeout(args.timeout, connect=min(args.timeout, 10.0))
    for attempt in range(args.retries + 1):
        try:
            httpx.get(url, timeout=timeout)
            return
        except httpx.HTTPError as e:
            if attempt == args.retries:
                raise Unreachable(
                    f"cannot reach {args.url}: {type(e).__name__}: {e} (nothing was sent)"
                ) from None
            time.sleep(1.0)


def _window(args: argparse.Namespace) -> int:
    return int(args.concurrency or (8 if args.url else 64))


@contextlib.asynccontextmanager
async def _executor(args: argparse.Namespace) -> AsyncIterator[Any]:
    """The line executor of --url or --model, closed afterwards."""
    if args.url is not None:
        import httpx

        from embedserve.batch.execute import Remote

        key = args.api_key or os.environ.get(API_KEY_ENV)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        limits = httpx.Limits(max_connections=_window(args))
        async with httpx.AsyncClient(timeout=args.timeout, headers=headers, limits=limits) as client:
            yield Remote(args.url, client, args.retries)
        return
    from embedserve.errors import ModelLoadError
    from embedserve.models.default import DEFAULT_MODEL_NAME, model_argument
    from embedserve.server.batch_lines import InProcess
    from embedserve.server.metrics import ServerMetrics
    from embedserve.server.runtime import ServerRuntime, ServerSettings

    model = args.model or model_argument(DEFAULT_MODEL_NAME)
    settings = ServerSettings(
        model=model, engine=EngineOptions.from_args(args), served_model_name=args.served_model_name
    )
    runtime = ServerRuntime(settings, ServerMetrics())  # the server's own load, warm-up and service
    try:
        await runtime.start()
        if runtime.service is None:
            raise ModelLoadError(f"{model}: {runtime.error or 'the server did not start'}")
        svc = runtime.service
        yield InProcess(lambda: svc, args.retries, settings.max_body_bytes)
    finally:
        await runtime.close()
