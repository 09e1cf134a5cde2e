"""Reference vectors kept on disk between runs: the reference is the slow side of every gate run.

A file is named by a sha256 of everything that determines the vectors: the backend's identity
(weights fingerprint, dtype, device, library versions), the prompt and every input item.
Only backends that declare an identity are cached (the reference), never a candidate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from embedserve.parity.datasets import Item, Parts


class VectorCache:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(identity: str, prompt: str, items: Sequence[Item]) -> str:
        digest = hashlib.sha256()
        for part in (identity, prompt):
            digest.update(part.encode() + b"\0")
        for item in items:
            if isinstance(item, str):
                digest.update(b"s" + item.encode() + b"\0")
            elif isinstance(item, Parts):
                for p in item.parts:
                    raw = p.encode() if isinstance(p, str) else p
                    digest.update(
                        (b"t" if isinstance(p, str) else b"b") + len(raw).to_bytes(8, "little") + raw
                    )
                digest.update(b"p\0")
            else:
                digest.update(b"i" + np.asarray(item, dtype=np.int64).tobytes() + b"\0")
        return digest.hexdigest()

    def load(self, key: str, count: int) -> np.ndarray | None:
        path = self.root / f"{key}.npy"
        if not path.exists():
            return None
        vectors = np.load(path)
        return vectors if vectors.ndim == 2 and vectors.shape[0] == count else None

    def store(self, key: str, vectors: np.ndarray) -> None:
        tmp = self.root / f"{key}.tmp.npy"
        np.save(tmp, vectors)
        tmp.replace(self.root / f"{key}.npy")  # atomic: a crash never leaves half a file
