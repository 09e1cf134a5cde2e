"""Build a C++ kernel of this package into a shared library and load it with ctypes.

The sources include ATen's headers and call into the libtorch the process already loaded
(oneDNN's brgemm, ATen's thread pool), so a kernel is compiled against the installed torch
with `-march=native` (less what EMBEDSERVE_CPU_ISA caps), once per (source, torch, compiler,
CPU, cap), and kept in a cache folder:

    $EMBEDSERVE_KERNEL_CACHE  or  ~/.cache/embedserve/kernels
        <name>-<sha256 of source and the package's headers, flags, torch version, compiler, CPU flags>.so

No compiler, a failed build or EMBEDSERVE_NATIVE_KERNELS=0 give None: callers keep their
PyTorch route. Builds of one key race safely (each writes a temp file, then renames).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from embedserve.kernels.isa import cpuinfo_lines
from embedserve.settings import settings

log = logging.getLogger(__name__)

SOURCES = Path(__file__).parent
_FLAGS = ("-O3", "-march=native", "-DNDEBUG", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-w")
# EMBEDSERVE_CPU_ISA: the CPU's own ISA minus what the cap leaves out (-mno-avx512f also drops
# every AVX-512 subset, AVX512_BF16 included; -mno-amx-tile drops AMX-BF16 and AMX-INT8).
CAP_FLAGS = {"avx2": ("-mno-avx512f", "-mno-amx-tile"), "avx512": ("-mno-amx-tile",), "amx": ()}
BUILD_TIMEOUT_S = 300


def cache_dir() -> Path:
    return settings().kernel_cache or Path.home() / ".cache" / "embedserve" / "kernels"


def _cpu_identity() -> str:
    """What -march=native compiles for: the first CPU's model and feature lines (x86
    `flags`, ARM `Features` and `CPU part`)."""
    lines = cpuinfo_lines(("model name", "flags", "Features", "CPU implementer", "CPU part"))
    if lines is None:
        return platform.processor()
    return "\n".join(lines) + platform.machine()


def _command(compiler: str, source: Path, target: Path) -> list[str]:
    torch_dir = Path(torch.__file__).parent
    abi = int(torch.compiled_with_cxx11_abi())
    return [
        *shlex.split(compiler),
        *_FLAGS,
        *(
            CAP_FLAGS.get(settings().cpu_isa or "amx", ())
            if platform.machine() in ("x86_64", "AMD64")
            else ()
        ),
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{torch_dir / 'include'}",
        str(source),
        f"-L{torch_dir / 'lib'}",
        f"-Wl,-rpath,{torch_dir / 'lib'}",
        "-ltorch_cpu",
        "-lc10",
        "-o",
        str(target),
    ]


def _key(compiler: str, source: Path) -> str:
    cmd = [*shlex.split(compiler), "--version"]
    version = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60).stdout
    command = " ".join(_command(compiler, source, Path("out.so")))  # flags, paths, ABI
    headers = [h.read_bytes() for h in sorted(SOURCES.glob("*.h"))]  # what the sources include
    parts = [source.read_bytes(), *headers, command.encode(), torch.__version__.encode(), version.encode()]
    parts.append(_cpu_identity().encode())
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def compiler() -> str | None:
    """The C++ compiler kernels are built with ($CXX, else g++ or c++ on PATH); None where
    native kernels are off or not supported (Linux only)."""
    if not settings().native_kernels or platform.system() != "Linux":
        return None
    return settings().cxx or shutil.which("g++") or shutil.which("c++")  # CXX may hold flags


def _build(compiler: str, source: Path, target: Path) -> None:
    """Compile into a temp file beside `target`, then rename (concurrent builds of one key
    race safely). Raises OSError with the compiler's message on failure."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        command = _command(compiler, source, Path(tmp))
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise OSError(f"{compiler} exited {done.returncode}:\n{done.stderr[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@cache
def load(name: str) -> ctypes.CDLL | None:
    """`<name>.cpp` of this package as a loaded library, built if not cached; None if it
    cannot be built or loaded here (a missing compiler, an unwritable cache: logged once)."""
    compiler_path = compiler()
    if compiler_path is None:
        return None
    source = SOURCES / f"{name}.cpp"
    try:
        target = cache_dir() / f"{name}-{_key(compiler_path, source)}.so"
        if not target.exists():
            log.info("building native kernel %s (once per machine and torch version)", name)
            _build(compiler_path, source, target)
        return ctypes.CDLL(str(target))
    except Exception as e:  # a missing HOME, a hung compiler, ...: PyTorch's ops still work
        log.warning("native kernel %s did not build or load; using PyTorch ops: %s", name, e)
        return None
