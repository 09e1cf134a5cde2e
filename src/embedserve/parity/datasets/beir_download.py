"""`beir:NAME`: a public BEIR dataset, from the data folder or downloaded into it once.

The folder is `<data dir>/beir/NAME` (corpus.jsonl, queries.jsonl, qrels/). When it is missing
the public zip `<base>/NAME.zip` is downloaded (base: $EMBEDSERVE_BEIR_URL, else the BEIR
mirror), checked against the md5 the BEIR README publishes (when listed below), unpacked into
a temporary folder with every member checked to stay inside it, and moved into place in one
rename: an interrupted download leaves nothing that looks like a dataset.
$EMBEDSERVE_OFFLINE=1 (or a failed connection) gives an error that says where to put the folder.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import IO, Any

from embedserve.parity.options import ParityError

PREFIX = "beir:"
DEFAULT_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets"
URL_ENV, OFFLINE_ENV = "EMBEDSERVE_BEIR_URL", "EMBEDSERVE_OFFLINE"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_CHUNK = 1 << 20
# md5 of each zip, from the BEIR README's dataset table.
KNOWN_MD5 = {
    "msmarco": "444067daf65d982533ea17ebd59501e4",
    "trec-covid": "ce62140cb23feb9becf6270d0d1fe6d1",
    "nfcorpus": "a89dba18a62ef92f7d323ec890a0d38d",
    "nq": "d4d3d2e48787a744b6f6e691ff534307",
    "hotpotqa": "f412724f78b0d91183a0e86805e16114",
    "fiqa": "17918ed23cd04fb15047f73e6c3bd9d9",
    "arguana": "8ad3e3c2a5867cdced806d6503f29b99",
    "webis-touche2020": "46f650ba5a527fc69e0a6521c5a23563",
    "cqadupstack": "4e41456d7df8ee7760a7f866133bda78",
    "quora": "18fb154900ba42a600f84b839c173167",
    "dbpedia-entity": "c2a39eb420a3164af735795df012ac2c",
    "scidocs": "38121350fc3a4d2f48850f6aff52e4a9",
    "fever": "5a818580227bfb4b35bb6fa46d9b6c03",
    "climate-fever": "8b66f0a9126c521bae2bde127b4dc99d",
    "scifact": "5f7d1de60b170fc8027bb7898e2efca1",
}


def beir_name(spec_name: str) -> str:
    """`beir:scifact` -> `scifact`, refusing names that are not a plain file name."""
    name = spec_name.removeprefix(PREFIX)
    if not _NAME.match(name):
        raise ParityError(f"dataset {spec_name!r}: a BEIR name is lowercase letters, digits, '.', '_' or '-'")
    return name


def _ready(folder: Path) -> bool:
    return (folder / "corpus.jsonl").is_file() and (folder / "queries.jsonl").is_file()


def beir_folder(spec_name: str, data_dir: Path, progress: bool = False) -> Path:
    """The unpacked folder of `beir:NAME` under `data_dir`, downloading it when missing."""
    name = beir_name(spec_name)
    folder = data_dir / "beir" / name
    if _ready(folder):
        return folder
    url = f"{os.environ.get(URL_ENV, DEFAULT_URL).rstrip('/')}/{name}.zip"
    where = (
        f"put the unpacked BEIR folder at {folder} (corpus.jsonl, queries.jsonl, qrels/test.tsv; "
        f"from {url}), or choose another data folder with --data-dir"
    )
    if os.environ.get(OFFLINE_ENV, "") not in ("", "0"):
        raise ParityError(f"dataset {spec_name}: not found and {OFFLINE_ENV} is set: {where}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{name}-") as tmp:
        archive = Path(tmp) / f"{name}.zip"
        try:
            digest = _download(url, archive, progress)
        except (urllib.error.URLError, OSError) as e:
            raise ParityError(f"dataset {spec_name}: download of {url} failed ({e}): {where}") from None
        want = KNOWN_MD5.get(name)
        if want is not None and digest != want:
            raise ParityError(f"dataset {spec_name}: {url} has md5 {digest}, expected {want}; nothing kept")
        unpacked = _unpack(archive, Path(tmp) / "unpacked", spec_name)
        if folder.exists():
            shutil.rmtree(folder)  # an incomplete folder left by hand
        os.replace(unpacked, folder)
    return folder


def _bar(total: int | None, label: str, progress: bool) -> Any:
    if not progress:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=label, unit="B", unit_scale=True, unit_divisor=1024)


def _download(url: str, dst: Path, progress: bool) -> str:
    """Stream `url` to `dst`; the md5 of what was written."""
    md5 = hashlib.md5(usedforsecurity=False)
    with urllib.request.urlopen(url, timeout=60) as response, dst.open("wb") as out:
        length = response.headers.get("Content-Length")
        bar = _bar(int(length) if length else None, f"download {dst.name}", progress)
        try:
            _copy(response, out, md5, bar)
        finally:
            if bar is not None:
                bar.close()
    return md5.hexdigest()


def _copy(src: IO[bytes], dst: IO[bytes], md5: Any, bar: Any) -> None:
    while block := src.read(_CHUNK):
        dst.write(block)
        md5.update(block)
        if bar is not None:
            bar.update(len(block))


def _unpack(archive: Path, dst: Path, spec_name: str) -> Path:
    """Extract every member inside `dst`; the folder holding corpus.jsonl."""
    try:
        with zipfile.ZipFile(archive) as zf:
            root = dst.resolve()
            for member in zf.infolist():
                target = (root / member.filename).resolve()
                if not target.is_relative_to(root):
                    raise ParityError(
                        f"dataset {spec_name}: zip member {member.filename!r} leaves its folder"
                    )
            bad = zf.testzip()
            if bad is not None:
                raise ParityError(f"dataset {spec_name}: zip member {bad!r} is corrupt")
            zf.extractall(root)
    except zipfile.BadZipFile as e:
        raise ParityError(f"dataset {spec_name}: the download is not a zip file ({e})") from None
    found = sorted(p.parent for p in dst.rglob("corpus.jsonl"))
    if not found or not _ready(found[0]):
        raise ParityError(f"dataset {spec_name}: the zip holds no corpus.jsonl with queries.jsonl beside it")
    return found[0]
