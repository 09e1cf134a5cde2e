"""Documents from files: .txt / .md / .rst (one document per file) and .jsonl (one per line).

Document ids must be stable across runs, because chunk ids (and so resumability) derive from
them: a file's id is its path relative to the folder named on the command line (or its name,
for a file named directly); a .jsonl line's id is its `id` field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from embedserve.index.errors import DocumentError

TEXT_SUFFIXES = (".txt", ".md", ".rst")
SUFFIXES = (*TEXT_SUFFIXES, ".jsonl")


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str


def _files(path: Path) -> list[tuple[Path, str]]:
    """(file, id prefix) pairs under `path`, in a stable order."""
    if path.is_file():
        if path.suffix not in SUFFIXES:
            raise DocumentError(f"{path}: unsupported file type (expected one of {', '.join(SUFFIXES)})")
        return [(path, path.name)]
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        return [(p, p.relative_to(path).as_posix()) for p in found]
    raise DocumentError(f"{path}: no such file or folder")


def _jsonl(path: Path) -> Iterator[Document]:
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DocumentError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise DocumentError(f"{path}:{line_no}: expected an object with 'id' and 'text'")
            doc_id, text = record.get("id"), record.get("text")
            if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or doc_id == "":
                raise DocumentError(f"{path}:{line_no}: 'id' must be a non-empty string or an integer")
            if not isinstance(text, str):
                raise DocumentError(f"{path}:{line_no}: 'text' must be a string")
            yield Document(str(doc_id), text)


def read_documents(paths: Sequence[str | Path]) -> Iterator[Document]:
    """Every document under `paths`, in order. Refuses a repeated id: two documents sharing an
    id would overwrite each other's chunks. Documents with only whitespace are left out:
    there is nothing to embed."""
    seen: set[str] = set()
    for raw in paths:
        for file, name in _files(Path(raw)):
            if file.suffix == ".jsonl":
                docs: Iterator[Document] = _jsonl(file)
            else:
                docs = iter([Document(name, file.read_text(encoding="utf-8", errors="replace"))])
            for doc in docs:
                if doc.doc_id in seen:
                    raise DocumentError(f"{file}: document id {doc.doc_id!r} appears twice")
                seen.add(doc.doc_id)
                if doc.text.strip():
                    yield doc
