"""A safetensors file's header (names, dtypes, shapes, offsets), read without torch: the tensor
reader (models/tensor_file.py) starts from it, and the gateway checks head shapes with it."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from embedserve.errors import ModelLoadError

_MAX_HEADER = 100 << 20


def read_header(path: Path) -> tuple[dict[str, dict[str, object]], int]:
    """(tensor entries by name, the byte offset where the data starts)."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ValueError("shorter than its header length")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER:
                raise ValueError(f"header length {n} is not plausible")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read weights from {path}: {e}") from e
    if not isinstance(header, dict):
        raise ModelLoadError(f"cannot read weights from {path}: its header is not a JSON object")
    header.pop("__metadata__", None)
    return header, 8 + n


def tensor_shape(path: Path, name: str) -> tuple[int, ...] | None:
    """The shape the header gives tensor `name` (None: no such tensor)."""
    entry = read_header(path)[0].get(name)
    shape = entry.get("shape") if isinstance(entry, dict) else None
    return None if not isinstance(shape, list) else tuple(int(d) for d in shape)
