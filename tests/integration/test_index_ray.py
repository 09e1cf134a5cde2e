"""`embedserve index --ray` on a local Ray instance gives the same rows as the local run.

Ray's local services (GCS, raylet, workers) listen on every interface and Ray offers no
setting to confine them, so the Ray run happens inside a private network namespace that has
only a loopback interface (`unshare --net`, root): nothing it opens is reachable from outside.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embedserve.cli import main
from embedserve.index.store import LIVE, Store
from tests.helpers.real_text import documents

CHUNKING = ["--max-tokens", "96", "--overlap", "8", "--batch-size", "32"]


def _isolated_network() -> str | None:
    """Why the Ray run cannot be isolated here, or None when it can."""
    if importlib.util.find_spec("ray") is None:
        return "ray is not installed (pip install -e '.[index]')"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs `unshare` and `ip` to run Ray in a loopback-only network namespace"
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace for Ray (needs root): {probe.stderr.strip()}"
    return None


def _rows_and_vectors(path: str) -> tuple[list[dict[str, object]], dict[str, np.ndarray]]:
    store = Store(path)
    try:
        collection = store.resolve(LIVE)
        rows = sorted(store.rows(collection), key=lambda r: str(r["id"]))
        got = store.client.get(collection, ids=[r["id"] for r in rows], output_fields=["vector"])
        return rows, {g["id"]: np.asarray(g["vector"], dtype=np.float32) for g in got}
    finally:
        store.close()


@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
@pytest.mark.skipif(_isolated_network() is not None, reason=str(_isolated_network()))
def test_ray_data_run_matches_the_local_run(qwen3_dir: Path, tmp_path: Path) -> None:
    docs = tmp_path / "docs.jsonl"
    texts = documents()[:40]
    docs.write_text("".join(json.dumps({"id": str(i + 1), "text": t}) + "\n" for i, t in enumerate(texts)))
    common = [str(docs), "--model", str(qwen3_dir), *CHUNKING, "--progress", "off"]
    assert main(["index", *common, "--store", str(tmp_path / "local.db")]) == 0

    ray_cmd = [sys.executable, "-m", "embedserve", "index", *common, "--store", str(tmp_path / "ray.db")]
    script = "ip link set lo up && exec " + " ".join(
        f"'{a}'" for a in [*ray_cmd, "--ray", "--ray-actors", "1"]
    )
    out = subprocess.run(
        ["unshare", "--net", "sh", "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "0 already stored" in out.stdout

    local_rows, local_vecs = _rows_and_vectors(str(tmp_path / "local.db"))
    ray_rows, ray_vecs = _rows_and_vectors(str(tmp_path / "ray.db"))
    assert len(local_rows) > 40 and ray_rows == local_rows  # ids, texts, hashes, metadata
    for cid, v in local_vecs.items():
        np.testing.assert_allclose(ray_vecs[cid], v, atol=2e-5)
