"""Tensors of a safetensors file, read one at a time with plain file reads (no memory map).

safetensors' own `safe_open` maps the whole file: every page a copy touches stays in this
process's resident set until the handle closes, so loading a model that way peaks at its
parameters plus the whole file (4.6 GB for BGE-M3's 2.3 GB). Read here, each tensor's bytes are
one temporary buffer, freed once the caller has copied it into its parameter: the peak is the
parameters plus the largest tensor.

One exception, `MAPPED`: a token embedding table (a row per vocabulary id, `embed_tokens` /
`word_embeddings`, 64 MB or more) is returned as a copy-on-write map of its bytes in the file.
A model that keeps it as its parameter (models/weights.py `is_mapped`: same dtype, CPU) reads
only the rows of the tokens it meets, and the rest stays on disk: a vocabulary of 250,002 x
1,024 float32 (BGE-M3) is 1 GB, of which text in one language touches a small part. The kernel
may drop those clean pages under memory pressure and read them again. A model file must not be
rewritten in place while a server maps it (as with any memory-mapped weights).

Format: an 8-byte little-endian header length, a JSON header (`{name: {"dtype", "shape",
"data_offsets": [begin, end]}}` relative to the data after it, and `__metadata__`), the data.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from embedserve.errors import ModelLoadError
from embedserve.models.tensor_header import read_header

# safetensors dtype -> (numpy dtype to read the bytes as, torch dtype to view them as)
_DTYPES: dict[str, tuple[type, torch.dtype]] = {
    "F64": (np.float64, torch.float64),
    "F32": (np.float32, torch.float32),
    "F16": (np.float16, torch.float16),
    "BF16": (np.uint16, torch.bfloat16),
    "I64": (np.int64, torch.int64),
    "I32": (np.int32, torch.int32),
    "I16": (np.int16, torch.int16),
    "I8": (np.int8, torch.int8),
    "U8": (np.uint8, torch.uint8),
    "BOOL": (np.bool_, torch.bool),
    "F8_E4M3": (np.uint8, torch.float8_e4m3fn),
    "F8_E5M2": (np.uint8, torch.float8_e5m2),
}
MAPPED = ("embed_tokens.weight", "word_embeddings.weight")  # name suffixes of token tables
_MAP_MIN_BYTES = 64 << 20


def read_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in file order, each read when asked for."""
    header, start = read_header(path)
    size = path.stat().st_size
    entries = sorted(header.items(), key=lambda kv: _offsets(kv[1])[0])
    with path.open("rb") as f:
        for name, entry in entries:
            tensor = _read(f, path, name, entry, start, size, mappable=name.endswith(MAPPED))
            yield name, tensor


def is_mapped(tensor: torch.Tensor) -> bool:
    """A tensor `read_tensors` mapped from its file instead of reading it (`MAPPED`)."""
    return bool(getattr(tensor, "embedserve_mapped", False))


def _offsets(entry: object) -> tuple[int, int]:
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        return (-1, -1)
    return offsets[0], offsets[1]


def _read(
    f: BinaryIO, path: Path, name: str, entry: object, start: int, size: int, mappable: bool = False
) -> torch.Tensor:
    begin, end = _offsets(entry)
    assert isinstance(entry, dict)
    kind, shape = entry.get("dtype"), entry.get("shape")
    if kind not in _DTYPES or not isinstance(shape, list):
        raise ModelLoadError(
            f"cannot read weights from {path}: tensor {name}: dtype {kind!r} / shape {shape!r}"
        )
    np_dtype, torch_dtype = _DTYPES[str(kind)]
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * np.dtype(np_dtype).itemsize
    if begin < 0 or end - begin != nbytes or start + end > size:
        raise ModelLoadError(
            f"cannot read weights from {path}: tensor {name}: data {begin}..{end} past its end"
        )
    itemsize = np.dtype(np_dtype).itemsize
    if mappable and nbytes >= _MAP_MIN_BYTES and (start + begin) % itemsize == 0:
        mapped = np.memmap(path, dtype=np_dtype, mode="c", offset=start + begin, shape=(count,))
        tensor = torch.from_numpy(mapped).view(torch_dtype).reshape(shape)
        tensor.embedserve_mapped = True  # type: ignore[attr-defined]  # models/weights.py is_mapped
        return tensor
    data: np.ndarray = np.empty(count, dtype=np_dtype)
    f.seek(start + begin)
    if nbytes and f.readinto(memoryview(data).cast("B")) != nbytes:  # type: ignore[attr-defined, arg-type]
        raise ModelLoadError(f"cannot read weights from {path}: tensor {name}: the file ends inside its data")
    return torch.from_numpy(data).view(torch_dtype).reshape(shape)
