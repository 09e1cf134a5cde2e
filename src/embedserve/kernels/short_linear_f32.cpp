// float32 linear layers for a few rows (short queries) with AVX-512, reading the weight oneDNN
// packed (models/linear.py `prepack`) in place: the float32 sibling of short_linear.cpp.
//
// oneDNN's float32 packing, for N % 64 == 0, is [N/64][K][64]: per block of 64 output columns,
// K rows of 64 floats. A pass takes 16 of those columns (one zmm) for up to 16 input rows: per
// k one load of the weights and one FMA per row with x[r, k] broadcast, 16 accumulators in
// registers. k runs in chunks of 64 rows (16 KB): the block's four passes read a chunk from
// L1, and each prefetches a quarter of the next chunk into L2 in address order. Passes over
// whole blocks instead read every fourth cache line, a stride the hardware prefetchers do not
// follow: the misses then wait one by one (slower than oneDNN; with this order faster,
// docs/performance.md, "Short rows on their own kernels"). Each pass also prefetches its own
// line 8 k ahead from L2 into L1, so its loads no longer wait on L2 (docs/performance.md,
// "fp32 short rows: the stream and the FMAs").
//
//   y[m, n] = x[m, :] . W[n, :] + bias[n]                  (`embedserve_short_linear_f32`)
//   y[m, n] = silu(x . G[n]) * (x . U[n])                  (`embedserve_short_silu_gate_up_f32`)
//
// Sums are float32 FMAs over k in order. Built by embedserve/kernels/native.py.

#include "cpu_vec.h"  // first: sets the ISA ATen's vec headers compile for

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <utility>

#if defined(__AVX512F__)
#include <immintrin.h>
#define EMBEDSERVE_SHORT_F32 1
#endif

namespace {

constexpr int64_t BLOCK = 64;  // output columns per packed block
constexpr int64_t LANES = 16;  // columns per pass
constexpr int64_t ROWS = 16;   // rows per pass
constexpr int64_t CHUNK = 64;  // k rows per chunk: 16 KB of a block, in L1

#ifdef EMBEDSERVE_SHORT_F32
using Vec = at::vec::Vectorized<float>;

// acc[r] (r < R) += x[r, k0:k1] . W[16 columns]: xt is the rows' group transposed, [k][ROWS]
// (one cache line per k), w the block's first row at the pass's columns; `ahead` is one line
// per k of the next chunk's rows to prefetch.
template <int R>
inline void dot16(const float* xt, const float* w, int64_t k0, int64_t k1, const char* ahead, __m512* acc) {
  __m512 c[R];
  for (int r = 0; r < R; ++r) c[r] = acc[r];
  for (int64_t i = k0; i < k1; ++i) {
    _mm_prefetch(ahead + (i - k0) * 64, _MM_HINT_T1);
    // and this pass's line 8 rows on from L2 into L1, so the load below does not wait for it
    // (past the chunk: the next chunk's rows, prefetched into L2 by now)
    _mm_prefetch(reinterpret_cast<const char*>(w + (i + 8) * BLOCK), _MM_HINT_T0);
    const __m512 b = _mm512_loadu_ps(w + i * BLOCK);
    for (int r = 0; r < R; ++r) c[r] = _mm512_fmadd_ps(_mm512_set1_ps(xt[i * ROWS + r]), b, c[r]);
  }
  for (int r = 0; r < R; ++r) acc[r] = c[r];
}

using Dot = void (*)(const float*, const float*, int64_t, int64_t, const char*, __m512*);

template <int... R>
constexpr auto dots(std::integer_sequence<int, R...>) {
  return std::array<Dot, sizeof...(R)>{&dot16<R + 1>...};
}
constexpr auto DOTS = dots(std::make_integer_sequence<int, ROWS>{});  // DOTS[r - 1]: r rows

template <bool gated>
void run(const float* x, int64_t m, int64_t k, int64_t ldx, const float* w, const float* u, const float* bias,
         int64_t n, float* y, int64_t ldy) {
  // x's rows in groups of 16, each transposed to [k][16]: rows that sit 4 KB apart would share
  // one L1 set, and 16 of them evict each other every k. Filled k outer, rows inner, so the
  // stores run in address order (row by row, each store landed in another line of a buffer
  // larger than L1, serial before the threads start; docs/performance.md, "fp32 short rows:
  // the stream and the FMAs"). A short group's missing rows are never read.
  const int64_t groups = (m + ROWS - 1) / ROWS;
  const std::unique_ptr<float[]> xt(new float[groups * k * ROWS]);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t rows = std::min(ROWS, m - g * ROWS);
    const float* src = x + g * ROWS * ldx;
    float* dst = xt.get() + g * k * ROWS;
    for (int64_t i = 0; i < k; ++i)
      for (int64_t r = 0; r < rows; ++r) dst[i * ROWS + r] = src[r * ldx + i];
  }
  at::parallel_for(0, n / BLOCK, 1, [&](int64_t b0, int64_t b1) {
    alignas(64) __m512 acc[2][BLOCK / LANES][ROWS];  // [weight][pass][row]: gate, up
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
        const int64_t rows = std::min(ROWS, m - r0);
        const float* xg = xt.get() + (r0 / ROWS) * k * ROWS;
        for (int wi = 0; wi < (gated ? 2 : 1); ++wi) {
          const float* wb = (wi == 0 ? w : u) + b * k * BLOCK;
          for (auto& pass : acc[wi])
            for (auto& a : pass) a = _mm512_setzero_ps();
          // k in chunks whose rows (CHUNK x 256 bytes) stay in L1 across the block's four
          // passes; each pass prefetches a quarter of the next chunk, in order
          for (int64_t k0 = 0; k0 < k; k0 += CHUNK) {
            const int64_t k1 = std::min(k, k0 + CHUNK);
            // the rows after this chunk: the next chunk, or after the last one the next
            // block's first (blocks follow each other; a prefetch past the end never faults)
            const char* next = reinterpret_cast<const char*>(wb + k1 * BLOCK);
            for (int64_t pass = 0; pass < BLOCK / LANES; ++pass) {
              DOTS[rows - 1](xg, wb + pass * LANES, k0, k1, next + pass * CHUNK * 64, acc[wi][pass]);
            }
          }
        }
        float* yb = y + r0 * ldy + b * BLOCK;
        for (int64_t pass = 0; pass < BLOCK / LANES; ++pass) {
          float* yq = yb + pass * LANES;
          if constexpr (gated) {
            for (int64_t r = 0; r < rows; ++r) {
              const Vec g(acc[0][pass][r]);
              const Vec s = g / (Vec(1.f) + g.neg().exp());
              _mm512_storeu_ps(yq + r * ldy, _mm512_mul_ps(s, acc[1][pass][r]));
            }
          } else {
            const __m512 bv = bias == nullptr ? _mm512_setzero_ps() : _mm512_loadu_ps(bias + b * BLOCK + pass * LANES);
            for (int64_t r = 0; r < rows; ++r) _mm512_storeu_ps(yq + r * ldy, _mm512_add_ps(acc[0][pass][r], bv));
          }
        }
      }
    }
  });
}
#endif

// 0: done; 1: not built for AVX-512 here; 2: shapes it does not take.
int check(int64_t m, int64_t k, int64_t ldx, int64_t n, int64_t ldy) {
#ifdef EMBEDSERVE_SHORT_F32
  if (m < 1 || k < 1 || n < BLOCK || n % BLOCK || ldx < k || ldy < n) return 2;
  return 0;
#else
  return 1;
#endif
}

// Both entry points: checked, then run (gated: `w2` is U, else `w2` is the bias or null); 3
// when the run threw (the rows' buffer not allocated): nothing is thrown into ctypes.
template <bool gated>
int entry(const float* x, int64_t m, int64_t k, int64_t ldx, const float* w, const float* w2, int64_t n, float* y,
          int64_t ldy) {
  const int rc = check(m, k, ldx, n, ldy);
#ifdef EMBEDSERVE_SHORT_F32
  if (rc == 0) {
    try {
      run<gated>(x, m, k, ldx, w, gated ? w2 : nullptr, gated ? nullptr : w2, n, y, ldy);
    } catch (...) {
      return 3;
    }
  }
#endif
  return rc;
}

}  // namespace

extern "C" int embedserve_short_linear_f32(const float* x, int64_t m, int64_t k, int64_t ldx, const float* w,
                                            const float* bias, int64_t n, float* y, int64_t ldy) {
  return entry<false>(x, m, k, ldx, w, bias, n, y, ldy);
}

extern "C" int embedserve_short_silu_gate_up_f32(const float* x, int64_t m, int64_t k, int64_t ldx,
                                                  const float* gate, const float* up, int64_t n, float* y, int64_t ldy) {
  return entry<true>(x, m, k, ldx, gate, up, n, y, ldy);
}
