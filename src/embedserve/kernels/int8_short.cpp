// int8 projections of a few rows (short queries, a decoder's pooled last rows), reading the int8
// weight oneDNN keeps (models/int8_linear.py) in place: per row, the int32 sums of q[t] . Wq[n],
// times w_scale[n] in float32 (what oneDNN's int8 matmul returns), then int8_finish.h's float
// steps (those int8_rows.cpp's `finish_rows` takes after oneDNN). Integer sums are exact in any
// order, so a row gets the bytes it gets in a large step (checked at load:
// kernels/int8_short.py `available`).
//
// Why: at a few rows oneDNN reorders the weight into its blocked layout inside every call (1.4x
// to 3.5x this kernel's time on the 0.6B shapes, docs/quantization.md, "Short rows").
//
// oneDNN's int8 weight (`qlinear_prepack`) is plain [K][N]: each weight row k holds the N output
// columns. A tile is 64 columns, one cache line of every row k. Its K lines are first repacked
// into a scratch buffer as [K/4][2 halves][4 registers of 8 columns x 4 k] (the order of
// AVX2's `vpmaddubsw` and of VNNI's `vpdpbusd`), then each pair of rows runs over the scratch
// from L1/L2 with 8 accumulators (2 rows x 32 columns of int32 sums):
//
//   AVX2:  acc += vpmaddwd(vpmaddubsw(x[t, k:k+4] broadcast, w), 1)   (two u8 x s8 products
//          per int16: exact, as 7-bit activations keep them under 2^15: models/int8_linear.py)
//   VNNI:  acc = vpdpbusd(acc, x, w)                                    (AVX-VNNI or AVX-512 VL)
//
// then int8_finish.h's steps on the tile's 64 columns of each row.
//
// Built by embedserve/kernels/native.py.

#include "cpu_vec.h"  // first: sets the ISA ATen's vec headers compile for
#include "int8_finish.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define EMBEDSERVE_INT8_SHORT 1
#endif

namespace {

constexpr int64_t TILE = 64;  // output columns per tile: one cache line of a weight row
constexpr int64_t HALF = 32;  // columns per half: 4 registers of 8 int32 sums

#ifdef EMBEDSERVE_INT8_SHORT
using Reg = __m256i;

inline Reg dot4(Reg acc, Reg x, Reg w, Reg ones) {
#if defined(__AVXVNNI__)
  (void)ones;
  return _mm256_dpbusd_avx_epi32(acc, x, w);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  (void)ones;
  return _mm256_dpbusd_epi32(acc, x, w);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w), ones));
#endif
}

inline Reg load(const void* p) { return _mm256_loadu_si256(static_cast<const Reg*>(p)); }

// The tile's K weight lines (columns n0..n0+63 of rows k) as [K/4][half][4][32 bytes]: register
// j of a half holds, per int32 lane, 4 consecutive k of one column. AVX2's unpacks work within
// 128-bit lanes, so register j's lanes are columns 4j..4j+3 and 16+4j..16+4j+3 of the half
// (`sums` puts them back in order).
void repack(const int8_t* w, int64_t k, int64_t n, int64_t n0, Reg* out) {
  constexpr int64_t AHEAD = 16;  // weight rows prefetched ahead: the stride is n bytes
  for (int64_t i = 0; i < k; i += 4) {
    const int8_t* p = w + i * n + n0;
    if (i + AHEAD < k) {
      for (int64_t r = 0; r < 4; ++r) _mm_prefetch(reinterpret_cast<const char*>(p + (AHEAD + r) * n), _MM_HINT_T0);
    }
    for (int64_t h = 0; h < 2; ++h) {
      const int8_t* ph = p + h * HALF;
      const Reg r0 = load(ph), r1 = load(ph + n), r2 = load(ph + 2 * n), r3 = load(ph + 3 * n);
      const Reg a = _mm256_unpacklo_epi8(r0, r1), b = _mm256_unpackhi_epi8(r0, r1);
      const Reg c = _mm256_unpacklo_epi8(r2, r3), d = _mm256_unpackhi_epi8(r2, r3);
      Reg* o = out + (i / 4) * 8 + h * 4;
      o[0] = _mm256_unpacklo_epi16(a, c);
      o[1] = _mm256_unpackhi_epi16(a, c);
      o[2] = _mm256_unpacklo_epi16(b, d);
      o[3] = _mm256_unpackhi_epi16(b, d);
    }
  }
}

// acc[r][0..3] = the half's 32 int32 sums of row r (R rows from q, rows `ldq` bytes apart), in
// column order. Two rows at a time: 8 accumulators (with 3, GCC spilled 9 of 12 to the stack).
template <int R>
void sums(const uint8_t* q, int64_t ldq, int64_t k, const Reg* tile, int64_t half, Reg (*acc)[4]) {
  Reg c[R * 4];
#pragma GCC unroll 8
  for (int j = 0; j < R * 4; ++j) c[j] = _mm256_setzero_si256();
  const Reg ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < k / 4; ++i) {
    const Reg* w = tile + i * 8 + half * 4;
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, q + r * ldq + 4 * i, sizeof four);
      const Reg x = _mm256_set1_epi32(four);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) c[r * 4 + j] = dot4(c[r * 4 + j], x, w[j], ones);
    }
  }
  for (int r = 0; r < R; ++r) {
    const Reg* v = c + r * 4;
    acc[r][0] = _mm256_permute2x128_si256(v[0], v[1], 0x20);
    acc[r][1] = _mm256_permute2x128_si256(v[2], v[3], 0x20);
    acc[r][2] = _mm256_permute2x128_si256(v[0], v[1], 0x31);
    acc[r][3] = _mm256_permute2x128_si256(v[2], v[3], 0x31);
  }
}

using Sums = void (*)(const uint8_t*, int64_t, int64_t, const Reg*, int64_t, Reg (*)[4]);
constexpr int RMAX = 2;
constexpr Sums SUMS[RMAX] = {&sums<1>, &sums<2>};

struct Args {
  const uint8_t* q;
  int64_t m, k;
  const int8_t* w;
  int64_t n;
  const float *w_scale, *scale, *zero, *fix, *bias, *xo;
  int64_t n_out;
  const float* w_out;
  float* y;
};

// Row t's 8 sums at `col` as oneDNN's int8 matmul returns them: float(sum) * w_scale.
inline void store_sums(const Args& a, int64_t t, int64_t col, Reg sum) {
  const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(sum), _mm256_loadu_ps(a.w_scale + col));
  _mm256_storeu_ps(a.y + t * a.n + col, v);
}

void run(const Args& a) {
  at::parallel_for(0, a.n / TILE, 1, [&](int64_t b0, int64_t b1) {
    std::vector<Reg> tile(static_cast<size_t>(a.k / 4 * 8));
    Reg acc[RMAX][4];
    for (int64_t b = b0; b < b1; ++b) {
      repack(a.w, a.k, a.n, b * TILE, tile.data());
      for (int64_t r0 = 0; r0 < a.m; r0 += RMAX) {
        const int64_t rows = std::min<int64_t>(RMAX, a.m - r0);
        for (int64_t h = 0; h < 2; ++h) {
          SUMS[rows - 1](a.q + r0 * a.k, a.k, a.k, tile.data(), h, acc);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < 4; ++j) store_sums(a, r0 + r, b * TILE + h * HALF + j * 8, acc[r][j]);
        }
        for (int64_t t = r0; t < r0 + rows; ++t) {
          const int64_t col = b * TILE;
          embedserve_int8::finish_segment(a.y + t * a.n + col, TILE, a.scale[t], a.zero[t] * a.scale[t], a.fix + col,
                                          a.bias + col, a.xo + t * a.n_out, a.n_out, a.w_out + col, a.n);
        }
      }
    }
  });
}
#endif

}  // namespace

// 0: done; 1: built here without AVX2 + FMA; 2: shapes it does not take (n a multiple of 64, k of
// 4); 3: the run threw (the scratch buffer not allocated): nothing is thrown into ctypes.
extern "C" int embedserve_int8_short_linear(const uint8_t* q, int64_t m, int64_t k, const int8_t* w, int64_t n,
                                            const float* w_scale, const float* scale, const float* zero,
                                            const float* fix, const float* bias, const float* xo, int64_t n_out,
                                            const float* w_out, float* y) {
#ifdef EMBEDSERVE_INT8_SHORT
  if (m < 1 || k < 4 || k % 4 || n < TILE || n % TILE || n_out < 0) return 2;
  try {
    run(Args{q, m, k, w, n, w_scale, scale, zero, fix, bias, xo, n_out, w_out, y});
  } catch (...) {
    return 3;
  }
  return 0;
#else
  (void)q, (void)m, (void)k, (void)w, (void)n, (void)w_scale, (void)scale, (void)zero;
  (void)fix, (void)bias, (void)xo, (void)n_out, (void)w_out, (void)y;
  return 1;
#endif
}

// The int8 dot product the kernel was built with here: 2 VNNI, 1 AVX2, 0 none.
extern "C" int embedserve_int8_short_isa() {
#if defined(EMBEDSERVE_INT8_SHORT) && (defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
  return 2;
#elif defined(EMBEDSERVE_INT8_SHORT)
  return 1;
#else
  return 0;
#endif
}
