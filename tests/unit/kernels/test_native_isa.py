"""The native kernels compile for the x86 CPUs this machine is not: AVX2 only (Zen 3,
Haswell-era clouds) and AVX-512 without AVX512_BF16 (Skylake / Cascade Lake). Each build
picks its code by the compiler's ISA macros (kernels/cpu_vec.h, kernels/vec_math.h); a
branch that does not compile would switch the kernel off on those machines, silently."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest

from embedserve.kernels import native

pytestmark = pytest.mark.skipif(
    native.compiler() is None or platform.machine() != "x86_64",
    reason="needs a C++ compiler for native kernels on x86-64",
)


# Every kernel source in kernels/, so a new one cannot be left out of the check.
KERNELS = sorted(source.stem for source in native.SOURCES.glob("*.cpp"))


def test_kernel_list_is_found() -> None:
    assert "short_forward" in KERNELS, KERNELS  # the glob sees the folder (and the one once forgotten)


@pytest.mark.parametrize("march", ["x86-64-v3", "skylake-avx512"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_compiles_for_other_x86_cpus(kernel: str, march: str, tmp_path: Path) -> None:
    compiler = native.compiler()
    assert compiler is not None
    command = native._command(compiler, native.SOURCES / f"{kernel}.cpp", tmp_path / "out.so")
    assert "-march=native" in command  # the flag this test replaces
    command = [f"-march={march}" if c == "-march=native" else c for c in command]
    done = subprocess.run([*command, "-fsyntax-only"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
