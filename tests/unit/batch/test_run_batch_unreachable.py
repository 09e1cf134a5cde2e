"""`embedserve run-batch --url` when the server cannot be reached: refused at the start (exit 2,
nothing sent, no files), and lines a server stopped answering mid-run are sent again by the
next run instead of being counted as done."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from embedserve.batch.format import INVALID_LINE, UNREACHABLE, failed
from embedserve.cli import main
from embedserve.engine.options import EngineOptions
from embedserve.server.run_batch import errors_path
from tests.helpers.fuzz import threaded_server
from tests.helpers.inprocess import server_client


def _lines(n: int) -> str:
    body = {"method": "POST", "url": "/v1/embeddings"}
    return "".join(
        json.dumps({"custom_id": f"r{i}", **body, "body": {"input": f"text {i}"}}) + "\n" for i in range(n)
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_url_that_answers_nothing_is_exit_2_before_any_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text(_lines(3))
    out = tmp_path / "out.jsonl"
    url = f"http://127.0.0.1:{_free_port()}"
    assert main(["run-batch", "-i", str(inp), "-o", str(out), "--url", url, "--retries", "0"]) == 2
    err = capsys.readouterr().err
    assert f"cannot reach {url}" in err and "nothing was sent" in err
    assert not out.exists() and not errors_path(out).exists()


def test_lines_the_server_could_not_be_reached_for_are_sent_again(qwen3_dir: Path, tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text(_lines(4))
    out = tmp_path / "out.jsonl"
    errors = errors_path(out)
    # what a run whose server went away after r0 left: r0 answered, r1 and r2 unreachable, r3
    # refused for good (kept: it is an answer)
    with server_client(qwen3_dir, engine=EngineOptions(deterministic=True)) as c:
        first = c.post("/v1/embeddings", json={"input": "text 0"}).json()
        out.write_text(
            json.dumps({"custom_id": "r0", "response": {"status_code": 200, "body": first}}) + "\n"
        )
        gone = [failed(i + 1, f"r{i}", UNREACHABLE, "http://127.0.0.1:1: ConnectError") for i in (1, 2)]
        refused = failed(4, "r3", INVALID_LINE, "line 4: kept")
        errors.write_text("".join(json.dumps(r.record()) + "\n" for r in [*gone, refused]))
        with threaded_server(c.app) as base:
            assert (
                main(["run-batch", "-i", str(inp), "-o", str(out), "--url", base]) == 1
            )  # r3 is still an error
    answered = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["custom_id"] for r in answered] == ["r0", "r1", "r2"]
    assert all(r["response"]["status_code"] == 200 for r in answered)
    assert [json.loads(x)["custom_id"] for x in errors.read_text().splitlines()] == ["r3"]
