"""This project's larger evaluation collections: `../shared/data` beside the repository.

Only CI machines have them (a user's clone does not): a test that measures retrieval on them
takes `needs_shared_data(...)`, which skips it with the missing folder named.
$EMBEDSERVE_SHARED_DATA points elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repository root
SHARED_DATA = Path(os.environ.get("EMBEDSERVE_SHARED_DATA") or ROOT.parent / "shared" / "data")


def missing(*subdirs: str) -> list[Path]:
    return [SHARED_DATA / s for s in subdirs if not (SHARED_DATA / s).is_dir()]


def needs_shared_data(*subdirs: str) -> pytest.MarkDecorator:
    """Skip unless every `SHARED_DATA/<subdir>` exists (the reason names the first missing one)."""
    absent = missing(*subdirs)
    reason = f"needs {absent[0]} (this project's CI evaluation data), absent here" if absent else ""
    return pytest.mark.skipif(bool(absent), reason=reason)
