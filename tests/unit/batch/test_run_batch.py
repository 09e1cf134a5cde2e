"""`embedserve run-batch`: lines answered as the server answers them (in-process and over HTTP),
bad lines in the error file with their line numbers, duplicates refused before any work, and
resume after a cut-short output file or a real Ctrl-C: every custom_id exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from embedserve.api.classify import ClassifyRequest
from embedserve.api.cohere import CohereEmbedRequest
from embedserve.api.protocol import EmbeddingRequest
from embedserve.batch.execute import Remote, at_batch_priority
from embedserve.batch.format import BatchLine, Result, answered, read_line
from embedserve.batch.runner import Progress, Sink, run
from embedserve.cli import main
from embedserve.engine.options import EngineOptions
from embedserve.server.run_batch import errors_path
from tests.helpers.fuzz import threaded_server
from tests.helpers.inprocess import server_client

REPO = Path(__file__).resolve().parents[3]
BODIES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/embeddings", {"input": "hello world"}),
    ("/v1/embeddings", {"input": "naïve café, 東京"}),
    ("/v1/embeddings", {"input": ["a first text", "a second, longer text of words"], "dimensions": 16}),
    ("/v1/embeddings", {"input": "base64 please", "encoding_format": "base64"}),
    ("/v2/embed", {"texts": ["cohere's body"], "input_type": "search_query"}),
    ("/embed", {"inputs": "TEI's body"}),
    ("/v1/score", {"text_1": "a query", "text_2": ["doc one", "doc two"]}),
    ("/tokenize", {"prompt": "count me"}),
]


def _line(cid: str, url: str, body: Any, method: str = "POST") -> str:
    return json.dumps({"custom_id": cid, "method": method, "url": url, "body": body})


def _batch_line(text: str) -> BatchLine:
    line = read_line(1, text.encode())
    assert isinstance(line, BatchLine), line
    return line


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(x + "\n" for x in lines))
    return path


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _run_batch(qwen3_dir: Path, inp: Path, out: Path, *extra: str) -> int:
    return main(
        ["run-batch", "-i", str(inp), "-o", str(out), "--model", str(qwen3_dir), "--deterministic", *extra]
    )


def _stable(body: Any) -> Any:
    """An answer without what differs per call (Cohere's `id`, a `created` time)."""
    return {k: v for k, v in body.items() if k not in ("id", "created")} if isinstance(body, dict) else body


def _direct(qwen3_dir: Path) -> list[Any]:
    with server_client(qwen3_dir, engine=EngineOptions(deterministic=True)) as c:
        return [_stable(c.post(url, json=body).json()) for url, body in BODIES]


def test_lines_are_answered_as_the_server_answers_them(qwen3_dir: Path, tmp_path: Path) -> None:
    inp = _write(tmp_path / "in.jsonl", [_line(f"r{i}", url, body) for i, (url, body) in enumerate(BODIES)])
    out = tmp_path / "out.jsonl"
    assert _run_batch(qwen3_dir, inp, out) == 0
    recs = _records(out)
    assert [r["custom_id"] for r in recs] == [f"r{i}" for i in range(len(BODIES))]
    assert all(r["response"]["status_code"] == 200 and r["error"] is None for r in recs)
    assert all(r["id"].startswith("batch_req_") and r["response"]["request_id"] for r in recs)
    # Bit-equal: the same JSON (floats as the server writes them) as direct calls of the bodies.
    assert [_stable(r["response"]["body"]) for r in recs] == _direct(qwen3_dir)
    assert not errors_path(out).exists()


def test_bad_lines_go_to_the_error_file_with_their_line_numbers(qwen3_dir: Path, tmp_path: Path) -> None:
    lines = [
        _line("ok1", "/v1/embeddings", {"input": "fine"}),
        "{not json",
        json.dumps({"method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}),
        _line("unknown-url", "/v9/nothing", {"input": "x"}),
        _line("bad-body", "/v1/embeddings", {"inputs": "x"}),
        _line("get", "/v1/embeddings", {"input": "x"}, method="GET"),
        json.dumps({"custom_id": "no-body", "method": "POST", "url": "/v1/embeddings"}),
        _line("wrong-task", "/v1/rerank", {"query": "q", "documents": ["d"]}),
        _line("ok2", "/v1/embeddings", {"input": "also fine"}),
    ]
    inp = _write(tmp_path / "in.jsonl", lines)
    out, errs = tmp_path / "out.jsonl", tmp_path / "errs.jsonl"
    assert _run_batch(qwen3_dir, inp, out, "--errors", str(errs)) == 1  # some lines failed
    assert [r["custom_id"] for r in _records(out)] == ["ok1", "ok2"]
    errors = _records(errs)
    assert [(e["line"], e["custom_id"]) for e in errors] == [
        (2, None),
        (3, None),
        (4, "unknown-url"),
        (5, "bad-body"),
        (6, "get"),
        (7, "no-body"),
        (8, "wrong-task"),
    ]
    by_id = {e["custom_id"]: e for e in errors}
    assert "not valid JSON" in errors[0]["error"]["message"] and errors[0]["response"] is None
    assert "unknown url '/v9/nothing'" in by_id["unknown-url"]["error"]["message"]
    assert "method must be POST" in by_id["get"]["error"]["message"]
    assert "missing body" in by_id["no-body"]["error"]["message"]
    # A body the route refuses: the server's own answer, status and error body.
    assert by_id["bad-body"]["response"]["status_code"] == 422 and by_id["bad-body"]["error"] is None
    assert "inputs" in by_id["bad-body"]["response"]["body"]["error"]["message"]
    assert by_id["wrong-task"]["response"]["status_code"] == 400
    # Run again: every line is written already, nothing is recomputed or written twice.
    assert _run_batch(qwen3_dir, inp, out, "--errors", str(errs)) == 1
    assert len(_records(out)) == 2 and len(_records(errs)) == 7


def test_a_duplicate_custom_id_is_refused_before_any_work(
    qwen3_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [_line(c, "/v1/embeddings", {"input": c}) for c in ("a", "b", "a", "c", "b", "a")]
    inp = _write(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    assert _run_batch(qwen3_dir, inp, out) == 2
    err = capsys.readouterr().err
    assert "duplicate custom_id: 'a' on lines 1, 3, 6; 'b' on lines 2, 5" in err
    assert "nothing was run" in err
    assert not out.exists() and not errors_path(out).exists()


def test_resume_after_a_cut_short_output_computes_only_what_is_missing(
    qwen3_dir: Path, tmp_path: Path
) -> None:
    n = 30
    inp = _write(
        tmp_path / "in.jsonl", [_line(f"r{i}", "/v1/embeddings", {"input": f"text {i}"}) for i in range(n)]
    )
    out = tmp_path / "out.jsonl"
    assert _run_batch(qwen3_dir, inp, out, "--concurrency", "4") == 0
    full = out.read_bytes().splitlines(keepends=True)
    # A crash: 11 lines written whole, the 12th cut off half-way.
    out.write_bytes(b"".join(full[:11]) + full[11][: len(full[11]) // 2])
    assert _run_batch(qwen3_dir, inp, out, "--concurrency", "4") == 0
    recs = _records(out)  # every line parses: the cut-off one was dropped, not appended to
    assert [r["custom_id"] for r in recs] == [f"r{i}" for i in range(n)]
    before = [json.loads(x)["response"]["body"] for x in full]
    assert [r["response"]["body"] for r in recs] == before


def test_ctrl_c_writes_what_was_answered_and_a_rerun_completes(qwen3_dir: Path, tmp_path: Path) -> None:
    n = 1500
    ids = [f"r{i}" for i in range(n)]
    inp = _write(tmp_path / "in.jsonl", [_line(c, "/v1/embeddings", {"input": f"text {c}"}) for c in ids])
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "embedserve", "run-batch", "-i", str(inp), "-o", str(out)]
    cmd += ["--model", str(qwen3_dir), "--deterministic", "--concurrency", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    deadline = time.monotonic() + 120
    while (not out.exists() or out.stat().st_size < 20_000) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "run the same command again" in err
    first = [r["custom_id"] for r in _records(out)]  # every written line is whole
    assert 0 < len(first) < n
    assert _run_batch(qwen3_dir, inp, out, "--concurrency", "16") == 0
    got = [r["custom_id"] for r in _records(out)]
    assert sorted(got) == sorted(ids) and len(set(got)) == n  # each exactly once
    rest = [c for c in ids if c not in set(first)]
    assert got == first + rest  # the first run's lines in input order, then the rest


def test_url_mode_answers_as_the_server_does(qwen3_dir: Path, tmp_path: Path) -> None:
    inp = _write(tmp_path / "in.jsonl", [_line(f"r{i}", url, body) for i, (url, body) in enumerate(BODIES)])
    out = tmp_path / "out.jsonl"
    with server_client(qwen3_dir, engine=EngineOptions(deterministic=True)) as c:
        direct = [_stable(c.post(url, json=body).json()) for url, body in BODIES]
        with threaded_server(c.app) as base:
            args = ["run-batch", "-i", str(inp), "-o", str(out), "--url", base, "--concurrency", "3"]
            assert main(args) == 0
    assert [_stable(r["response"]["body"]) for r in _records(out)] == direct


def test_remote_waits_out_backpressure_and_sends_the_batch_class() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) < 3:
            return httpx.Response(429 if len(seen) == 1 else 503, headers={"Retry-After": "0"})
        return httpx.Response(200, json={"ok": True}, headers={"x-request-id": "abc"})

    first = _batch_line(_line("a", "/v1/embeddings", {"input": "x"}))

    async def go(retries: int, line: BatchLine = first) -> Result:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await Remote("http://h/", client, retries)(line)

    result = asyncio.run(go(5))
    assert (result.status, result.body, result.request_id) == (200, {"ok": True}, "abc")
    assert [str(r.url) for r in seen] == ["http://h/v1/embeddings"] * 3
    assert all(r.headers["x-embedserve-priority"] == "batch" for r in seen)
    seen.clear()
    assert asyncio.run(go(0)).status == 429  # out of retries: the refusal is the answer
    seen.clear()
    asyncio.run(go(0, _batch_line(_line("b", "/v1/embeddings", {"input": "x", "priority": "online"}))))
    assert "x-embedserve-priority" not in seen[0].headers  # the body's own class wins


def test_lines_run_at_batch_priority_unless_the_body_says() -> None:
    def parse(model: Any) -> Any:
        return at_batch_priority(lambda b: model.model_validate_json(b))

    assert parse(EmbeddingRequest)(b'{"input": "x"}').priority == "batch"
    assert parse(EmbeddingRequest)(b'{"input": "x", "priority": "online"}').priority == "online"
    assert parse(ClassifyRequest)(b'{"input": "x"}').priority == "batch"
    assert not hasattr(parse(CohereEmbedRequest)(b'{"texts": ["x"]}'), "priority")  # no classes there


def test_the_window_bounds_lines_in_flight_and_keeps_input_order(tmp_path: Path) -> None:
    lines = [read_line(i + 1, _line(f"r{i}", "/v1/embeddings", {"input": "x"}).encode()) for i in range(40)]
    in_flight, most = 0, 0

    async def execute(line: BatchLine) -> Result:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.001 * ((40 - line.line) % 7))  # later lines often finish first
        in_flight -= 1
        return answered(line, 200, {"n": line.line})

    sink = Sink(tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    outcome = asyncio.run(run(lines, execute, sink, 5, asyncio.Event(), Progress(40)))
    sink.close()
    assert most <= 5 and outcome.ok == 40 and not outcome.interrupted
    assert [r["response"]["body"]["n"] for r in _records(tmp_path / "out.jsonl")] == list(range(1, 41))


def test_a_stop_writes_what_was_answered_and_nothing_in_flight(tmp_path: Path) -> None:
    lines = [read_line(i + 1, _line(f"r{i}", "/v1/embeddings", {"input": "x"}).encode()) for i in range(40)]

    async def go() -> Any:
        stop = asyncio.Event()

        async def execute(line: BatchLine) -> Result:
            if line.line == 10:
                stop.set()  # Ctrl-C while lines 10.. are in flight
            if line.line >= 10:
                await asyncio.sleep(30)
            return answered(line, 200, {})

        sink = Sink(tmp_path / "out.jsonl", tmp_path / "err.jsonl")
        try:
            return await run(lines, execute, sink, 4, stop, Progress(40))
        finally:
            sink.close()

    outcome = asyncio.run(go())
    assert outcome.interrupted and outcome.ok == 9
    assert [r["custom_id"] for r in _records(tmp_path / "out.jsonl")] == [f"r{i}" for i in range(9)]


def test_unusable_commands_exit_2_before_any_work(
    qwen3_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = _write(tmp_path / "in.jsonl", [_line("a", "/v1/embeddings", {"input": "x"})])
    out = str(tmp_path / "out.jsonl")
    cases = [
        (["-i", str(tmp_path / "none.jsonl"), "-o", out, "--url", "http://h"], "no input file"),
        (["-i", str(inp), "-o", str(tmp_path / "no" / "out.jsonl"), "--url", "http://h"], "no folder"),
        (["-i", str(inp), "-o", out, "--url", "http://h", "--model", str(qwen3_dir)], "do not go with --url"),
        (["-i", str(inp), "-o", out, "--url", "http://h", "--deterministic"], "do not go with --url"),
    ]
    for args, message in cases:
        assert main(["run-batch", *args]) == 2
        assert message in capsys.readouterr().err
    assert not Path(out).exists()
