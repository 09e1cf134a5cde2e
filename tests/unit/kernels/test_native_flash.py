"""The native flash kernel (kernels/flash_attention.cpp) equals float64 masked softmax
attention in fp32 and within bf16 rounding of it in bf16, and the CPU routes use it only
where it built and checked itself."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention

from embedserve.attention import cpu as attention
from embedserve.attention.cpu_gemm import gemm_attention
from embedserve.kernels import flash_attention, isa, native
from embedserve.settings import settings

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C++ compiler for native kernels")


# bf16 runs on every x86 CPU: on the bf16 brgemm where the CPU has bf16 dot products, else on
# the float32 kernel over float32 copies (test_bf16_without_bf16_brgemm_is_the_float32_kernel)
DTYPES = [torch.float32, torch.bfloat16]
# (rtol, atol) against float64: fp32 rounding, and bf16 inputs and outputs
TOLERANCE = {torch.float32: (1e-5, 2e-6), torch.bfloat16: (2e-2, 2e-2)}


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_builds_and_passes_its_self_check_here(dtype: torch.dtype) -> None:
    """With a compiler present the kernel must build and match float64 (a broken kernel
    would otherwise switch itself off and every test would quietly run PyTorch's routes)."""
    assert flash_attention.available(dtype)


def _want(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """float64 SDPA with an explicit bottom-right causal mask and expanded KV heads."""
    n, heads, d = q.shape
    kv_heads, kv, _ = k.shape
    groups = heads // kv_heads
    mask = torch.arange(kv)[None, :] <= torch.arange(kv - n, kv)[:, None]
    o = scaled_dot_product_attention(
        q.double().transpose(0, 1)[None],
        k.double().repeat_interleave(groups, 0)[None],
        v.double().repeat_interleave(groups, 0)[None],
        attn_mask=mask,
        scale=scale,
    )
    return o[0].transpose(0, 1).reshape(n, heads * d)


@pytest.mark.parametrize(
    ("n", "kv", "heads", "kv_heads", "d"),
    [
        (1, 1, 2, 1, 8),  # one query, one key
        (37, 37, 4, 2, 16),  # a first chunk inside one tile and one key block
        (300, 1100, 4, 2, 16),  # tiles and key blocks with remainders, a prefix
        (129, 700, 6, 3, 64),  # a tile one row past the edge
        (70, 70, 8, 1, 32),  # 8 query heads on one KV head: tiles of 32 queries
        (100, 400, 21, 3, 16),  # 7 query heads per KV head (Qwen2-7B's 28/4): tiles of 36 queries
        (257, 2000, 2, 2, 128),  # no GQA, Qwen3's head_dim
        (520, 520, 9, 3, 64),  # SmolLM2's heads: a short prompt's tiles of 64 queries
        (200, 4300, 4, 2, 16),  # keys past SHORT_KEYS: the long prompts' tiles
        (70, 333, 8, 2, 80),  # head_dim 80: vector and scalar remainders in a row
        (50, 290, 4, 2, 24),  # head_dim 24
    ],
)
def test_kernel_equals_float64_masked_attention(n: int, kv: int, heads: int, kv_heads: int, d: int) -> None:
    gen = torch.Generator().manual_seed(n * kv)
    q = torch.randn(n, heads, d, generator=gen)
    k, v = (torch.randn(kv_heads, kv, d, generator=gen) for _ in range(2))
    got = flash_attention.flash_attention(q, k, v, d**-0.5)
    assert got.shape == (n, heads * d) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _want(q, k, v, d**-0.5), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_peaked_scores_underflow_to_exact_zeros(dtype: torch.dtype) -> None:
    """Scores tens to hundreds apart: most probabilities underflow (exp of -100 and below),
    the rest must weigh as float64 does (the kernel's own exp, not libm's). Integer q and k
    and a power-of-two scale make every score exact in both dtypes, so the exp and the sums
    are all that differ from the reference."""
    gen = torch.Generator().manual_seed(7)
    n, kv, heads, kv_heads, d = 90, 333, 4, 2, 16
    q = torch.randint(-12, 13, (n, heads, d), generator=gen).to(dtype)
    k = torch.randint(-12, 13, (kv_heads, kv, d), generator=gen).to(dtype)
    v = torch.randn(kv_heads, kv, d, generator=gen).to(dtype)
    got = flash_attention.flash_attention(q, k, v, 0.25)
    want = _want(q, k, v, 0.25)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_infinite_scores_give_what_float64_gives(dtype: torch.dtype) -> None:
    """A key whose score overflows to -inf, and one whose score is huge but finite, weigh
    nothing, as in float64: their exp must be 0, not NaN (exp's range reduction of -inf) or
    inf (its polynomial far outside the range)."""
    gen = torch.Generator().manual_seed(3)
    n, kv, heads, kv_heads, d = 20, 80, 2, 1, 32
    q = torch.rand(n, heads, d, generator=gen) + 0.5  # positive: every q . q[0, 0] is too
    k = torch.randn(kv_heads, kv, d, generator=gen)
    k[:, 5] = -1e38 * q[0, 0]  # q . k overflows float32: -inf
    k[:, 9] = -1e25 * q[0, 0]  # about -1e25: finite
    v = torch.randn(kv_heads, kv, d, generator=gen)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    got = flash_attention.flash_attention(q, k, v, d**-0.5).double()
    assert torch.isfinite(got).all()
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(got, _want(q, k, v, d**-0.5), rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    ("n", "kv", "heads", "kv_heads", "d"),
    [
        (1, 1, 2, 1, 8),
        (37, 37, 4, 2, 16),
        (300, 1100, 4, 2, 16),  # tiles and key blocks with remainders, a prefix
        (100, 400, 21, 3, 16),  # 7 query heads per KV head
        (257, 2000, 16, 8, 128),  # Qwen3-0.6B's heads
        (520, 520, 9, 3, 64),  # SmolLM2's heads, a short prompt's tiles
        (130, 4300, 4, 2, 32),  # keys past SHORT_KEYS
        (45, 301, 4, 2, 64),  # an odd key count: V's last key pair half padding
        (33, 257, 2, 2, 128),
        (70, 333, 8, 2, 80),  # head_dim 80 (Phi-2's), 96 below (Phi-3's)
        (40, 129, 4, 1, 96),
    ],
)
def test_bf16_within_bf16_rounding_of_float64(n: int, kv: int, heads: int, kv_heads: int, d: int) -> None:
    """bf16 inputs, fp32 scores and softmax: closer to float64 than the tiled bf16 matmul
    route, which rounds the scores to bf16 (a mispacked VNNI operand is off by O(1))."""
    gen = torch.Generator().manual_seed(n + kv)
    q = (2 * torch.randn(n, heads, d, generator=gen)).bfloat16()
    k, v = (torch.randn(kv_heads, kv, d, generator=gen).bfloat16() for _ in range(2))
    want = _want(q, k, v, d**-0.5)
    got = flash_attention.flash_attention(q, k, v, d**-0.5)
    assert got.shape == (n, heads * d) and got.dtype == torch.bfloat16
    error = ((got.double() - want).norm() / want.norm()).item()
    tiled = ((gemm_attention(q, k, v, d**-0.5).double() - want).norm() / want.norm()).item()
    assert error < 5e-3 and error <= tiled
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_inputs_as_the_engine_passes_them(dtype: torch.dtype) -> None:
    """q a view of a fused QKV output; K/V transposed views of a paged cache ([kv, kv_heads, d])
    and of the lane's buffer (a head-major prefix of a longer NaN-padded allocation)."""
    gen = torch.Generator().manual_seed(1)
    n, kv, heads, kv_heads, d = 90, 600, 4, 2, 32
    qkv = torch.randn(n, heads + 2 * kv_heads, d, generator=gen).to(dtype)
    q = qkv[:, :heads]
    cache = torch.randn(2, kv, kv_heads, d, generator=gen).to(dtype)
    paged_k, paged_v = cache[0].transpose(0, 1), cache[1].transpose(0, 1)
    lane = torch.full((2, kv_heads, kv + 100, d), float("nan"), dtype=dtype)
    lane[:, :, :kv] = cache.transpose(1, 2)
    want = _want(q, paged_k, paged_v, 0.2)
    rtol, atol = TOLERANCE[dtype]
    for k, v in ((paged_k, paged_v), (lane[0, :, :kv], lane[1, :, :kv])):
        got = flash_attention.flash_attention(q, k, v, 0.2)
        torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_writes_into_a_row_slice_of_the_step_output(dtype: torch.dtype) -> None:
    """paged_attention hands each sequence its rows of the step's output: the kernel writes
    there (no copy), the same values as a fresh result, rows around the slice untouched; an
    `out` it cannot write (strided, wrong shape) is refused, and other routes copy into it."""
    gen = torch.Generator().manual_seed(4)
    n, kv, heads, kv_heads, d = 70, 200, 4, 2, 32
    q = torch.randn(n, heads, d, generator=gen).to(dtype)
    k, v = (torch.randn(kv_heads, kv, d, generator=gen).to(dtype) for _ in range(2))
    step = torch.full((n + 20, heads * d), 7.0, dtype=dtype)
    rows = step[10 : 10 + n]
    got = attention.causal_attention(q, k, v, 0.2, attention.CpuRoute.NATIVE, rows)
    assert got.data_ptr() == rows.data_ptr()
    assert torch.equal(rows, flash_attention.flash_attention(q, k, v, 0.2))
    assert (step[:10] == 7).all() and (step[10 + n :] == 7).all()
    with pytest.raises(ValueError, match="contiguous"):
        flash_attention.flash_attention(q, k, v, 0.2, torch.empty(heads * d, n, dtype=dtype).t())
    other = torch.empty(n, heads * d, dtype=dtype)
    attention.causal_attention(q, k, v, 0.2, attention.CpuRoute.PYTORCH, other)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(other.double(), _want(q, k, v, 0.2), rtol=rtol, atol=atol)


def test_running_max_rises_across_key_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scores that grow with the key index to ~500 (the row max changes in every block and the
    output is rescaled each time; a softmax without the max overflows). Rounding scores that
    large costs fp32 ~4e-5 in any kernel: the error vs float64 is held near PyTorch flash's."""
    gen = torch.Generator().manual_seed(2)
    n, kv, d = 40, 1500, 16
    q = torch.ones(n, 2, d) + 0.01 * torch.randn(n, 2, d, generator=gen)
    ramp = torch.linspace(0, 30, kv)[:, None]
    k = (ramp + 0.1 * torch.randn(kv, d, generator=gen))[None]
    v = torch.randn(1, kv, d, generator=gen)
    want = _want(q, k, v, 1.0)
    got = flash_attention.flash_attention(q, k, v, 1.0)
    flash = attention.causal_attention(q, k, v, 1.0, attention.CpuRoute.PYTORCH)
    error, flash_error = ((x.double() - want).abs().max().item() for x in (got, flash))
    assert torch.isfinite(got).all() and 0 < error <= 2 * flash_error and error < 1e-4


def test_bad_inputs_are_refused_by_name() -> None:
    q, kv = torch.randn(5, 2, 8), torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match=r"kv >= n.*q \(5, 2, 8\)"):
        flash_attention.flash_attention(q, kv, kv, 1.0)  # more queries than keys
    with pytest.raises(ValueError, match=r"float32 or bfloat16 CPU tensors of one dtype.*torch.bfloat16"):
        flash_attention.flash_attention(q[:4], kv.bfloat16(), kv.bfloat16(), 1.0)
    with pytest.raises(ValueError, match=r"float32 or bfloat16 CPU tensors.*torch.float16"):
        flash_attention.flash_attention(q[:4].half(), kv.half(), kv.half(), 1.0)
    with pytest.raises(ValueError, match=r"even head_dim.*\(4, 2, 7\)"):
        odd = torch.randn(1, 4, 7).bfloat16()
        flash_attention.flash_attention(q[:4, :, :7].bfloat16(), odd, odd, 1.0)
    with pytest.raises(ValueError, match="kv >= n"):
        flash_attention.flash_attention(q[:4], kv, kv[:, :, :4], 1.0)  # v's head_dim differs
    with pytest.raises(ValueError, match="kv >= n"):
        flash_attention.flash_attention(torch.randn(4, 3, 8), kv.expand(2, 4, 8), kv.expand(2, 4, 8), 1.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_route_uses_the_kernel_from_native_min_rows(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    calls: list[int] = []
    real = flash_attention.flash_attention

    def counted(q: torch.Tensor, *args: Any) -> torch.Tensor:
        calls.append(len(q))
        return real(q, *args)

    monkeypatch.setattr(flash_attention, "flash_attention", counted)
    gen = torch.Generator().manual_seed(3)
    k, v = (torch.randn(2, 100, 16, generator=gen).to(dtype) for _ in range(2))
    least = attention.NATIVE_MIN_ROWS[dtype]
    rtol, atol = TOLERANCE[dtype]
    for n in (least - 1, least, 100):
        q = torch.randn(n, 4, 16, generator=gen).to(dtype)
        got = attention.causal_attention(q, k, v, 0.25)
        torch.testing.assert_close(got.double(), _want(q, k, v, 0.25), rtol=rtol, atol=atol)
    assert calls == [least, 100]
    odd = torch.randn(2, 100, 15, generator=gen).to(dtype)  # bf16 needs an even head_dim
    attention.causal_attention(torch.randn(100, 4, 15, generator=gen).to(dtype), odd, odd, 0.25)
    assert calls == [least, 100, 100] if dtype == torch.float32 else calls == [least, 100]
    without = attention.cpu_route(100, 100, dtype, 16, native=False)  # the kernel did not build
    fallback = attention.CpuRoute.BF16_GEMM if dtype == torch.bfloat16 else attention.CpuRoute.PYTORCH
    assert without is fallback
    attention.causal_attention(torch.randn(100, 4, 16).to(dtype), k, v, 0.25, without)
    assert len(calls) == (3 if dtype == torch.float32 else 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_short_whole_sequence_takes_sdpa(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    """A first chunk under SDPA_WHOLE_BELOW tokens (a short query) is one SDPA call; from
    that length, or with earlier context, the tiled routes take it."""
    routes: list[str] = []
    real_native, real_gemm = flash_attention.flash_attention, attention.gemm_attention
    real_sdpa = attention.scaled_dot_product_attention

    def native_route(*args: Any) -> torch.Tensor:
        routes.append("native")
        return real_native(*args)

    def gemm_route(*args: Any) -> torch.Tensor:
        routes.append("gemm")
        return real_gemm(*args)

    def sdpa_route(*args: Any, **kwargs: Any) -> torch.Tensor:
        routes.append("sdpa")
        return real_sdpa(*args, **kwargs)

    monkeypatch.setattr(flash_attention, "flash_attention", native_route)
    monkeypatch.setattr(attention, "gemm_attention", gemm_route)
    monkeypatch.setattr(attention, "scaled_dot_product_attention", sdpa_route)
    monkeypatch.setattr(attention, "NATIVE_MIN_ROWS", {torch.float32: 16, torch.bfloat16: 16})
    gen = torch.Generator().manual_seed(4)
    below = attention.SDPA_WHOLE_BELOW
    rtol, atol = TOLERANCE[dtype]
    for n, kv in ((1, 1), (16, 16), (below - 1, below - 1), (below, below), (16, below)):
        q = torch.randn(n, 4, 16, generator=gen).to(dtype)
        k, v = (torch.randn(2, kv, 16, generator=gen).to(dtype) for _ in range(2))
        got = attention.causal_attention(q, k, v, 0.25)
        torch.testing.assert_close(got.double(), _want(q, k, v, 0.25), rtol=rtol, atol=atol)
    tiled = "native" if flash_attention.available(dtype) else ("gemm" if dtype == torch.bfloat16 else "sdpa")
    assert routes[:3] == ["sdpa"] * 3
    if tiled != "sdpa":
        assert routes[3:] == [tiled, tiled]


def test_no_compiler_or_switched_off_means_no_kernel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def setenv(name: str, value: str | None) -> None:  # the settings are read once: re-read
        if value is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, value)
        settings.cache_clear()
        native.load.cache_clear()

    setenv("EMBEDSERVE_KERNEL_CACHE", str(tmp_path))
    try:
        setenv("EMBEDSERVE_NATIVE_KERNELS", "0")
        assert native.load("flash_attention") is None
        setenv("EMBEDSERVE_NATIVE_KERNELS", "1")
        setenv("CXX", "false")  # a "compiler" that always fails
        with caplog.at_level(logging.WARNING, logger="embedserve.kernels.native"):
            assert native.load("flash_attention") is None
            setenv("CXX", str(tmp_path / "no-such-compiler"))
            assert native.load("flash_attention") is None
        assert caplog.text.count("did not build or load") == 2
        assert list(tmp_path.iterdir()) == []  # no half-written library left behind
        setenv("CXX", None)
        (tmp_path / "file").write_text("")  # a cache folder that cannot be created
        setenv("EMBEDSERVE_KERNEL_CACHE", str(tmp_path / "file" / "kernels"))
        assert native.load("flash_attention") is None
    finally:
        native.load.cache_clear()


def test_built_once_then_loaded_from_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EMBEDSERVE_KERNEL_CACHE", str(tmp_path))
    native.load.cache_clear()
    try:
        assert native.load("flash_attention") is not None
        (built,) = tmp_path.iterdir()
        assert built.name.startswith("flash_attention-") and built.suffix == ".so"
        stamp = built.stat().st_mtime_ns
        native.load.cache_clear()

        def no_build(*args: object) -> None:
            raise AssertionError("rebuilt although cached")

        monkeypatch.setattr(native, "_build", no_build)
        assert native.load("flash_attention") is not None
        assert built.stat().st_mtime_ns == stamp
    finally:
        native.load.cache_clear()


def test_cache_key_follows_the_shared_header(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A kernel includes cpu_vec.h: editing the header alone must not load a stale library."""
    for f in ("flash_attention.cpp", "cpu_vec.h"):
        (tmp_path / f).write_bytes((native.SOURCES / f).read_bytes())
    monkeypatch.setattr(native, "SOURCES", tmp_path)
    compiler = native.compiler()
    assert compiler is not None
    source = tmp_path / "flash_attention.cpp"
    before = native._key(compiler, source)
    assert native._key(compiler, source) == before
    (tmp_path / "cpu_vec.h").write_text((tmp_path / "cpu_vec.h").read_text() + "\n// edited\n")
    assert native._key(compiler, source) != before


@pytest.mark.parametrize(("n", "kv", "heads", "kv_heads", "d"), [(37, 37, 4, 2, 16), (300, 1100, 4, 2, 64)])
def test_bf16_without_bf16_brgemm_is_the_float32_kernel(
    n: int, kv: int, heads: int, kv_heads: int, d: int
) -> None:
    """The bf16 entry for CPUs without bf16 brgemm (it runs on any CPU): the float32 kernel on
    the exact float32 values of strided bf16 inputs, its output rounded to bf16 once."""
    via, fp32 = flash_attention._entry("bf16_f32"), flash_attention._entry("f32")
    assert via is not None and fp32 is not None
    gen = torch.Generator().manual_seed(n)
    q = torch.randn(n, 2 * heads, d, generator=gen).bfloat16()[:, ::2]  # strided heads
    k, v = torch.randn(2, kv, kv_heads, d, generator=gen).bfloat16().transpose(1, 2)  # cache views
    got = flash_attention._run(via, q, k, v, 0.3)
    want = flash_attention._run(fp32, q.float(), k.float(), v.float(), 0.3).bfloat16()
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    assert flash_attention._matches_float64(via, torch.bfloat16)


@pytest.mark.skipif(not isa.bf16_dot_products(), reason="the CPU has no bf16 dot products")
def test_a_cpu_with_bf16_dot_products_runs_the_bf16_brgemm_entry() -> None:
    """Where bf16 brgemm is the fast path, the fp32-copies entry would hide a broken kernel."""
    assert flash_attention._kernel(torch.bfloat16) is flash_attention._entry("bf16")
