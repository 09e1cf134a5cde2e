"""benchmarks/short_rows_ab.py, run as a user runs it on a tiny decoder's shapes: the package's
fp32 short-rows kernel passes its check against torch and is timed beside the weight stream; a
variant that computes something else is refused before any timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from embedserve.kernels import native
from tests.helpers.cpu import short_rows_dtypes

ROOT = Path(__file__).resolve().parents[3]
FLOAT32 = short_rows_dtypes()[1]
assert FLOAT32.values == (torch.float32,)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build folder for the module: the package's kernel is built once."""
    return tmp_path_factory.mktemp("short-rows-built")


def _run(tmp_path: Path, built: Path, *sources: Path) -> subprocess.CompletedProcess[str]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    cfg = {
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
    }
    (model / "config.json").write_text(json.dumps(cfg))
    cmd = [sys.executable, "benchmarks/short_rows_ab.py", "--model", str(model), "--rounds", "2"]
    cmd += ["--threads", "1", "--out", str(built), *map(str, sources)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("dtype", [FLOAT32])
def test_the_kernel_is_checked_then_timed_beside_the_stream(
    tmp_path: Path, built: Path, dtype: torch.dtype
) -> None:
    done = _run(tmp_path, built)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "short_linear_f32.cpp: largest difference to torch" in done.stdout
    assert "16 rows, 2 layers" in done.stdout
    assert "weight stream (torch.sum)" in done.stdout


@pytest.mark.parametrize("dtype", [FLOAT32])
def test_a_variant_that_computes_something_else_is_refused(
    tmp_path: Path, built: Path, dtype: torch.dtype
) -> None:
    passes = (native.SOURCES / "short_f32.h").read_text()  # the passes the kernel runs
    right = "fma(a, b[j], c[r * NREG + j])"
    assert right in passes, "the kernel's inner FMA moved: update this test's mutation"
    (tmp_path / "short_f32.h").write_text(passes.replace(right, "fma(a, a, c[r * NREG + j])"))
    wrong = tmp_path / "wrong.cpp"  # the kernel's source, beside the mutated passes
    wrong.write_text((native.SOURCES / "short_linear_f32.cpp").read_text())
    (tmp_path / "cpu_vec.h").write_text((native.SOURCES / "cpu_vec.h").read_text())
    done = _run(tmp_path, built, native.SOURCES / "short_linear_f32.cpp", wrong)
    assert done.returncode != 0
    assert "wrong.cpp computes something else" in done.stderr
    assert "GFLOP/s" not in done.stdout  # nothing timed
