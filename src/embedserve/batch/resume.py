"""What must be done before any work: the input's custom_ids checked for duplicates, and the
lines a previous run already wrote (output and error files; a partly written last line, from a
crash, is cut off so the next line starts clean). Only keys are kept in memory, never bodies:
about 100 bytes a line."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from embedserve.api.protocol import clip
from embedserve.batch.format import Key, custom_id_of, tokens_of
from embedserve.errors import EmbedServeError

_SHOWN_DUPLICATES = 5


class BatchFileError(EmbedServeError):
    """An input with duplicate custom_ids, or an output file this tool did not write."""


def input_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, text) of every non-blank line."""
    with path.open("rb") as f:
        for number, text in enumerate(f, 1):
            if text.strip():
                yield number, text


@dataclass(frozen=True)
class Scan:
    lines: int  # non-blank input lines
    keys: frozenset[Key]  # every line's key (format.py), for counting what is left


def scan(path: Path) -> Scan:
    """Every line's key; BatchFileError naming each duplicate custom_id and its line numbers."""
    first: dict[str, int] = {}
    dups: dict[str, list[int]] = {}
    keys: set[Key] = set()
    n = 0
    for number, text in input_lines(path):
        n += 1
        try:
            cid = custom_id_of(json.loads(text))
        except ValueError:
            cid = None
        if cid is None:
            keys.add(number)
        elif cid in first:
            dups.setdefault(cid, [first[cid]]).append(number)
        else:
            first[cid] = number
            keys.add(cid)
    if dups:
        shown = [
            f"{clip(cid)} on lines {', '.join(map(str, ns))}"
            for cid, ns in list(dups.items())[:_SHOWN_DUPLICATES]
        ]
        more = f" (and {len(dups) - _SHOWN_DUPLICATES} more)" if len(dups) > _SHOWN_DUPLICATES else ""
        raise BatchFileError(
            f"{path}: duplicate custom_id: {'; '.join(shown)}{more}; each line needs its own "
            "custom_id (nothing was run)"
        )
    return Scan(n, frozenset(keys))


def written_keys(path: Path) -> set[Key]:
    """The keys of the lines `path` holds (none when it does not exist); a last line cut short
    by a crash is removed from the file."""
    keys: set[Key] = set()
    if not path.exists():
        return keys
    good_end = 0
    with path.open("rb") as f:
        for number, text in enumerate(f, 1):
            try:
                rec = json.loads(text) if text.endswith(b"\n") else None
            except ValueError:
                rec = None
            if not isinstance(rec, dict):
                if f.read(1):  # not the last line: not a file this tool wrote
                    raise BatchFileError(f"{path}: line {number} is not a batch output line")
                break
            cid, line = custom_id_of(rec), rec.get("line")
            if cid is not None:
                keys.add(cid)
            elif isinstance(line, int):
                keys.add(line)
            good_end += len(text)
    if good_end < path.stat().st_size:
        with path.open("r+b") as f:
            f.truncate(good_end)
            os.fsync(f.fileno())
    return keys


def drop_unsent(path: Path, codes: frozenset[str]) -> int:
    """Remove from an error file the lines whose error code is one of `codes` (lines never
    answered because the server could not be reached: a new run sends them again); how many.
    The file is rewritten beside itself and renamed over it, so a crash leaves either."""
    if not path.exists():
        return 0
    dropped = 0
    tmp = path.with_name(path.name + ".tmp")
    try:
        with path.open("rb") as f, tmp.open("wb") as out:  # line by line: bodies never all in memory
            for text in f:
                try:
                    rec = json.loads(text)
                except ValueError:
                    rec = None
                error = rec.get("error") if isinstance(rec, dict) else None
                if isinstance(error, dict) and error.get("code") in codes:
                    dropped += 1
                else:
                    out.write(text)
            out.flush()
            os.fsync(out.fileno())
        if dropped:
            shutil.copymode(path, tmp)
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return dropped


def written_tokens(path: Path) -> int:
    """The tokens the answers in an output file report (format.py `tokens_of`)."""
    total = 0
    with path.open("rb") as f:
        for text in f:
            rec = json.loads(text)
            total += tokens_of((rec.get("response") or {}).get("body"))
    return total


def resume_point(out: Path, err: Path) -> tuple[set[Key], set[Key], int]:
    """The keys both files hold (a half-written last line cut off) and the tokens answered."""
    done_ok, done_failed = written_keys(out), written_keys(err)
    return done_ok, done_failed, written_tokens(out) if done_ok else 0
