"""The environment switches: defaults when unset, exact parsing, a named error for a bad value,
read once per process."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedserve.errors import SettingsError
from embedserve.kernels import native
from embedserve.settings import Settings, settings
from embedserve.worker import host_memory

SWITCHES = (
    "EMBEDSERVE_NATIVE_KERNELS",
    "EMBEDSERVE_HEAP_REUSE",
    "EMBEDSERVE_PREPACK",
    "EMBEDSERVE_SHORT_ROWS",
    "EMBEDSERVE_HUGE_PAGES",
    "EMBEDSERVE_CPU_BF16",
    "EMBEDSERVE_CPU_INT8",
)


def test_unset_or_empty_variables_mean_the_defaults() -> None:
    switches = ("native_kernels", "heap_reuse", "prepack", "short_rows", "huge_pages")
    want = Settings(
        **dict.fromkeys(switches, True),
        kernel_cache=None,
        cxx=None,
        cpu_isa=None,
        cpu_bf16=False,
        cpu_int8=False,
    )
    assert Settings.from_env({}) == want
    assert Settings.from_env({name: "" for name in (*SWITCHES, "EMBEDSERVE_KERNEL_CACHE", "CXX")}) == want


@pytest.mark.parametrize(("value", "on"), [("0", False), ("1", True), ("off", False), (" True ", True)])
def test_each_switch_reads_its_own_variable(value: str, on: bool) -> None:
    fields = {"EMBEDSERVE_NATIVE_KERNELS": "native_kernels", "EMBEDSERVE_HEAP_REUSE": "heap_reuse"}
    fields |= {"EMBEDSERVE_PREPACK": "prepack", "EMBEDSERVE_SHORT_ROWS": "short_rows"}
    fields |= {"EMBEDSERVE_HUGE_PAGES": "huge_pages"}
    for name, field in fields.items():
        got = Settings.from_env({name: value})
        assert getattr(got, field) is on
        assert all(getattr(got, other) for other in fields.values() if other != field)


def test_the_cpu_isa_cap_and_the_bf16_switch() -> None:
    assert Settings.from_env({}).cpu_isa is None and Settings.from_env({}).cpu_bf16 is False
    assert Settings.from_env({"EMBEDSERVE_CPU_ISA": " AVX2 "}).cpu_isa == "avx2"
    assert Settings.from_env({"EMBEDSERVE_CPU_ISA": "amx"}).cpu_isa == "amx"
    assert Settings.from_env({"EMBEDSERVE_CPU_BF16": "1"}).cpu_bf16 is True
    assert Settings.from_env({}).cpu_int8 is False
    assert Settings.from_env({"EMBEDSERVE_CPU_INT8": "1"}).cpu_int8 is True
    with pytest.raises(SettingsError, match=r"EMBEDSERVE_CPU_ISA='sse4': use one of avx2 \| avx512 \| amx"):
        Settings.from_env({"EMBEDSERVE_CPU_ISA": "sse4"})


def test_paths_and_the_compiler_are_taken_as_given() -> None:
    got = Settings.from_env({"EMBEDSERVE_KERNEL_CACHE": "/tmp/k", "CXX": "ccache g++ -g"})
    assert got.kernel_cache == Path("/tmp/k") and got.cxx == "ccache g++ -g"


@pytest.mark.parametrize("name", SWITCHES)
def test_a_bad_value_names_the_variable_and_the_accepted_values(name: str) -> None:
    with pytest.raises(SettingsError, match=rf"{name}='maybe' .* 0 \| false \| no \| off") as e:
        Settings.from_env({name: "maybe"})
    assert "1 | true | yes | on" in str(e.value) and isinstance(e.value, ValueError)


def test_read_once_until_the_cache_is_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBEDSERVE_PREPACK", "0")
    assert settings().prepack is False
    monkeypatch.setenv("EMBEDSERVE_PREPACK", "1")
    assert settings().prepack is False and settings() is settings()
    settings.cache_clear()
    assert settings().prepack is True


def test_the_modules_read_the_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EMBEDSERVE_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "my-cxx -O1")
    assert native.cache_dir() == tmp_path
    if native.compiler() is not None:  # Linux
        assert native.compiler() == "my-cxx -O1"
    settings.cache_clear()
    monkeypatch.setenv("EMBEDSERVE_NATIVE_KERNELS", "0")
    assert native.compiler() is None
    settings.cache_clear()
    monkeypatch.setenv("EMBEDSERVE_HEAP_REUSE", "0")
    host_memory.keep_freed_heap.cache_clear()
    try:
        assert host_memory.keep_freed_heap() is False
    finally:
        host_memory.keep_freed_heap.cache_clear()


def test_a_bad_value_stops_the_first_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBEDSERVE_NATIVE_KERNELS", "2")
    with pytest.raises(SettingsError, match="EMBEDSERVE_NATIVE_KERNELS='2'"):
        native.compiler()
