"""The CPU's instruction sets as the engine reads them (kernels/isa.py): EMBEDSERVE_CPU_ISA caps
the native kernels (an AVX-512 machine then runs the AVX2 code, so CI runs it on any x86-64
CPU with AVX2 + FMA), and bfloat16 runs as float32 on a CPU without bf16 dot products."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from embedserve.kernels import isa, native
from embedserve.settings import settings
from tests.helpers.cpu import has

ZEN3 = frozenset({"avx", "avx2", "fma", "f16c"})
ZEN4 = ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}
SKYLAKE_X = ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
SAPPHIRE = ZEN4 | {"amx_tile", "amx_bf16"}


Env = Callable[..., None]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """Set environment variables for this test, the settings read afresh."""

    def set_env(**values: str) -> None:
        for name in ("EMBEDSERVE_CPU_ISA", "EMBEDSERVE_CPU_BF16", "ONEDNN_MAX_CPU_ISA"):
            monkeypatch.delenv(name, raising=False)
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        settings.cache_clear()

    yield set_env
    settings.cache_clear()


def _cpu(monkeypatch: pytest.MonkeyPatch, flags: frozenset[str], x86: bool = True) -> None:
    monkeypatch.setattr(isa, "cpu_flags", lambda: flags)
    monkeypatch.setattr(isa, "_x86", lambda: x86)


@pytest.mark.parametrize(
    ("flags", "cap", "want"),
    [
        (ZEN3, "", "avx2"),
        (ZEN4, "", "avx512"),
        (SAPPHIRE, "", "amx"),
        (SAPPHIRE, "avx512", "avx512"),
        (SAPPHIRE, "avx2", "avx2"),
        (ZEN3, "amx", "avx2"),  # a cap never adds what the CPU lacks
        (frozenset({"avx", "sse4_2"}), "", None),  # below AVX2 + FMA: no kernels
    ],
)
def test_the_kernels_isa_is_the_cpus_under_the_cap(
    monkeypatch: pytest.MonkeyPatch, env: Env, flags: frozenset[str], cap: str, want: str | None
) -> None:
    env(**({"EMBEDSERVE_CPU_ISA": cap} if cap else {}))
    _cpu(monkeypatch, flags)
    assert isa.kernel_isa() == want


@pytest.mark.parametrize(
    ("flags", "environ", "want"),
    [
        (ZEN4, {}, True),
        (SAPPHIRE, {}, True),
        (ZEN3, {}, False),
        (SKYLAKE_X, {}, False),  # AVX-512 without AVX512_BF16: oneDNN emulates bf16
        (ZEN4, {"EMBEDSERVE_CPU_ISA": "avx2"}, False),
        (ZEN4, {"EMBEDSERVE_CPU_ISA": "avx512"}, True),
        (ZEN4, {"ONEDNN_MAX_CPU_ISA": "avx512_core"}, False),
        (ZEN4, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, True),
        (ZEN4, {"ONEDNN_MAX_CPU_ISA": "something_new"}, True),
    ],
)
def test_bf16_dot_products_follow_the_flags_and_the_caps(
    monkeypatch: pytest.MonkeyPatch, env: Env, flags: frozenset[str], environ: dict[str, str], want: bool
) -> None:
    env(**environ)
    _cpu(monkeypatch, flags)
    assert isa.bf16_dot_products() is want


@pytest.mark.parametrize(
    ("flags", "cap", "want"),
    [
        (ZEN3, "", False),  # AVX2 only: vpmaddubsw + vpmaddwd, no faster than float32 FMAs
        (SKYLAKE_X, "", False),  # AVX-512 without VNNI
        (ZEN4 | {"avx512_vnni"}, "", True),
        (ZEN4 | {"avx512_vnni"}, "avx2", False),  # the cap takes AVX-512, and its VNNI, away
        (ZEN3 | {"avx_vnni"}, "avx2", True),  # AVX-VNNI is VEX: AVX2 machines have it (Alder Lake)
        (SAPPHIRE | {"amx_int8"}, "avx512", False),  # the cap takes AMX away; no avx512_vnni listed
        (SAPPHIRE | {"amx_int8"}, "", True),
    ],
)
def test_int8_dot_products_follow_the_flags_and_the_cap(
    monkeypatch: pytest.MonkeyPatch, env: Env, flags: frozenset[str], cap: str, want: bool
) -> None:
    env(**({"EMBEDSERVE_CPU_ISA": cap} if cap else {}))
    _cpu(monkeypatch, flags)
    assert isa.int8_dot_products() is want


def test_arm_reads_its_bf16_feature(monkeypatch: pytest.MonkeyPatch, env: Env) -> None:
    env()
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    _cpu(monkeypatch, frozenset({"asimd", "bf16"}), x86=False)
    assert isa.bf16_dot_products() is True
    _cpu(monkeypatch, frozenset({"asimd"}), x86=False)
    assert isa.bf16_dot_products() is False and isa.kernel_isa() is None


def test_bf16_runs_as_float32_where_the_cpu_has_no_bf16_dot_products(
    monkeypatch: pytest.MonkeyPatch, env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    env(EMBEDSERVE_CPU_BF16="0")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(isa, "bf16_dot_products", lambda: False)
    with caplog.at_level(logging.WARNING, logger="embedserve.kernels.isa"):
        assert isa.cpu_dtype(torch.bfloat16, cpu) == torch.float32
    assert "no bfloat16 dot products" in caplog.text and "EMBEDSERVE_CPU_BF16=1" in caplog.text
    assert isa.cpu_dtype(torch.float32, cpu) == torch.float32
    assert isa.cpu_dtype(torch.bfloat16, cuda) == torch.bfloat16  # a GPU decides for itself
    env(EMBEDSERVE_CPU_BF16="1")  # asked for bf16 whatever it costs
    assert isa.cpu_dtype(torch.bfloat16, cpu) == torch.bfloat16
    env(EMBEDSERVE_CPU_BF16="0")
    monkeypatch.setattr(isa, "bf16_dot_products", lambda: True)
    assert isa.cpu_dtype(torch.bfloat16, cpu) == torch.bfloat16


@pytest.mark.skipif(native.compiler() is None or platform.machine() != "x86_64", reason="x86-64 + C++")
def test_the_cap_reaches_the_compiler_and_the_cache_key(env: Env, tmp_path: Path) -> None:
    compiler, source = native.compiler(), native.SOURCES / "norm_rope.cpp"
    assert compiler is not None
    env()
    plain, plain_key = native._command(compiler, source, tmp_path / "a.so"), native._key(compiler, source)
    env(EMBEDSERVE_CPU_ISA="avx2")
    capped = native._command(compiler, source, tmp_path / "a.so")
    assert "-mno-avx512f" in capped and "-mno-amx-tile" in capped and "-mno-avx512f" not in plain
    assert native._key(compiler, source) != plain_key  # a capped build never reuses the CPU's own
    env(EMBEDSERVE_CPU_ISA="avx512")
    assert "-mno-amx-tile" in native._command(compiler, source, tmp_path / "a.so")


_CHILD = """
import json, sys, torch
from embedserve import Engine
from embedserve.engine.builder import build_engine
from embedserve.kernels import flash_attention, isa, native, norm_rope, short_linear
from embedserve.schema import backend_profile, dtype_name
from tests.helpers.reference import hf_embed_ids, random_ids, cosine
lib = native.load("short_linear_f32")
seqs = [random_ids(n, seed=n) for n in (3, 16, 40, 300)]
parts = build_engine(sys.argv[1], dtype="bfloat16", max_num_batched_tokens=128, kv_cache_memory=1 << 24)
short = parts.core.runner.model.short_path is not None
with Engine(parts) as engine:
    got = engine.embed(seqs)
    cfg = engine.config
print(json.dumps({
    "isa": isa.kernel_isa(), "aten": torch.backends.cpu.get_cpu_capability(),
    "lanes": lib.embedserve_short_f32_lanes() if lib is not None else None,
    "kernels": [short_linear.available(torch.float32), flash_attention.available(torch.float32),
                norm_rope.available(torch.float32)],
    "short_path": short, "dtype": dtype_name(cfg.dtype), "profile": backend_profile(cfg.device, cfg.dtype),
    "cos": float(cosine(got, hf_embed_ids(sys.argv[1], seqs)).min()),
}))
"""


# CI time (2026-12-07): on an AVX2 CI box the whole suite runs this path; the cap is for larger CPUs
@pytest.mark.slow
@pytest.mark.skipif(
    native.compiler() is None or platform.machine() != "x86_64" or not (has("avx2") and has("fma")),
    reason="needs x86-64 with AVX2 + FMA and a C++ compiler",
)
def test_avx2_kernels_serve_bf16_as_float32_and_match_transformers(qwen3_dir: Path) -> None:
    """A process capped to AVX2 everywhere (the kernels, oneDNN, ATen, MKL) is an AVX2-only
    machine: the fp32 short-rows kernel runs its 8-float passes, every fp32 kernel passes its
    self-check, short steps run natively, and bfloat16 runs as float32 with the fp32 vectors."""
    caps = {"EMBEDSERVE_CPU_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    environ = os.environ | caps | {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "EMBEDSERVE_CPU_BF16": "0"}
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(qwen3_dir)],
        env=environ | {"PYTHONPATH": str(root)},
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["isa"] == "avx2" and got["aten"] == "AVX2" and got["lanes"] == 8, got
    assert got["kernels"] == [True, True, True] and got["short_path"], got
    assert got["dtype"] == "float32" and got["profile"] == "cpu-fp32", got
    assert got["cos"] > 0.99999, got
