"""`beir:NAME`: found in the data folder, else downloaded once (from a loopback server), verified,
unpacked; refusals for a bad zip, a wrong md5, a path-escaping member and offline use."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from embedserve.parity.datasets import DatasetContext, beir_download, check_dataset, load_dataset
from embedserve.parity.options import ParityError


def _zip(name: str, extra: dict[str, str] | None = None) -> bytes:
    files = {
        f"{name}/corpus.jsonl": "\n".join(
            json.dumps(r)
            for r in [{"_id": "d1", "title": "Wings", "text": "lift"}, {"_id": "d2", "text": "drag"}]
        ),
        f"{name}/queries.jsonl": json.dumps({"_id": "q1", "text": "what lifts"}),
        f"{name}/qrels/test.tsv": "query-id\tcorpus-id\tscore\nq1\td1\t1\n",
        **(extra or {}),
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return buf.getvalue()


class _Server:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        files, requests = self.files, self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                requests.append(self.path)
                body = files.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/beir"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Server]:
    s = _Server()
    thread = threading.Thread(target=s.httpd.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv(beir_download.URL_ENV, s.url)
    monkeypatch.delenv(beir_download.OFFLINE_ENV, raising=False)
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def _ctx(data_dir: Path) -> DatasetContext:
    return DatasetContext(data_dir, lambda t: len(t.split()) + 1, [], None, progress=True)


def test_downloads_once_verifies_and_loads(
    server: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blob = _zip("tiny")
    server.files["/beir/tiny.zip"] = blob
    monkeypatch.setitem(beir_download.KNOWN_MD5, "tiny", hashlib.md5(blob, usedforsecurity=False).hexdigest())
    ds = load_dataset("beir:tiny", _ctx(tmp_path))
    assert ds.corpus == {"d1": "Wings lift", "d2": "drag"} and ds.qrels == {"q1": {"d1": 1}}
    assert (tmp_path / "beir" / "tiny" / "qrels" / "test.tsv").is_file()
    assert [p.name for p in (tmp_path / "beir").iterdir()] == ["tiny"]  # no zip or temp folder left
    load_dataset("beir:tiny?queries=1", _ctx(tmp_path))
    assert server.requests == ["/beir/tiny.zip"]  # the second load reads the folder


def test_a_wrong_md5_keeps_nothing(server: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server.files["/beir/tiny.zip"] = _zip("tiny")
    monkeypatch.setitem(beir_download.KNOWN_MD5, "tiny", "0" * 32)
    with pytest.raises(ParityError, match="expected 0000"):
        load_dataset("beir:tiny", _ctx(tmp_path))
    assert list((tmp_path / "beir").iterdir()) == []


def test_a_member_outside_the_folder_is_refused(server: _Server, tmp_path: Path) -> None:
    server.files["/beir/evil.zip"] = _zip("evil", {"../../escaped.txt": "x"})
    with pytest.raises(ParityError, match="leaves its folder"):
        load_dataset("beir:evil", _ctx(tmp_path / "data"))
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "data" / "beir" / "evil").exists()


def test_not_a_zip_and_missing_names_say_where_to_put_the_folder(server: _Server, tmp_path: Path) -> None:
    server.files["/beir/junk.zip"] = b"<html>not a zip</html>"
    with pytest.raises(ParityError, match="not a zip"):
        load_dataset("beir:junk", _ctx(tmp_path))
    with pytest.raises(ParityError, match=f"put the unpacked BEIR folder at {tmp_path / 'beir' / 'absent'}"):
        load_dataset("beir:absent", _ctx(tmp_path))  # 404


def test_offline_names_the_folder_without_connecting(
    server: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(beir_download.OFFLINE_ENV, "1")
    with pytest.raises(
        ParityError, match=f"is set: put the unpacked BEIR folder at {tmp_path / 'beir' / 'scifact'}"
    ):
        load_dataset("beir:scifact", _ctx(tmp_path))
    assert server.requests == []


def test_bad_names_are_refused_before_anything_loads() -> None:
    check_dataset("beir:scifact")
    for bad in ("beir:", "beir:../x", "beir:Sci Fact"):
        with pytest.raises(ParityError, match="a BEIR name is"):
            check_dataset(bad)
