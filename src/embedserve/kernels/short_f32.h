// The float32 short-rows passes (AVX-512 or AVX2 FMAs), shared by the kernels that run them:
// short_linear_f32.cpp over oneDNN's packed float32 weight, read in place, and
// short_linear_w8.cpp over int8 weights widened to float32 chunk by chunk.
//
// A block is 64 output columns of a weight laid out [N/64][K][64]: per k one row of 64 floats.
// A pass takes 16 of those columns (one cache line: one AVX-512 register or two AVX2 ones) for
// up to 16 input rows (AVX2: 6 at a time, of its 16 registers): per k one load of the line and
// one FMA per row and register with x[r, k] broadcast, the accumulators in registers. k runs in
// chunks of 64 rows (16 KB: in L1 across the block's passes). Sums are float32 FMAs over k in
// order, whatever the ISA and whichever kernel: a weight gives the same bits through either.
#pragma once

#include "cpu_vec.h"  // first: sets the ISA ATen's vec headers compile for

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <utility>

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)  // cpu_vec.h's choice
#include <immintrin.h>
#define EMBEDSERVE_SHORT_F32 1
#endif

namespace {

constexpr int64_t BLOCK = 64;  // output columns per packed block
constexpr int64_t ROWS = 16;   // rows per transposed group
constexpr int64_t CHUNK = 64;  // k rows per chunk: 16 KB of a block, in L1

#ifdef EMBEDSERVE_SHORT_F32
using Vec = at::vec::Vectorized<float>;

// The ISA's register (ATen's Vec's) and the operations the passes use: the only code per ISA.
// A pass covers one cache line of a block row (16 columns): one AVX-512 register, or two AVX2
// ones, for up to RMAX rows (32 registers: 16 accumulators; 16 registers: 12).
#if defined(CPU_CAPABILITY_AVX512)
using Reg = __m512;
constexpr int RMAX = 16;
inline Reg load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
inline Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
inline Reg broadcast(const float* p) { return _mm512_set1_ps(*p); }  // folded into the FMA
inline Reg zero() { return _mm512_setzero_ps(); }
inline Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
inline Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
// LANES int8 values at p as floats
inline Reg widen(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#else
using Reg = __m256;
constexpr int RMAX = 6;  // 12 accumulators, the line's two registers and the broadcast
inline Reg load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
inline Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
inline Reg broadcast(const float* p) { return _mm256_broadcast_ss(p); }
inline Reg zero() { return _mm256_setzero_ps(); }
inline Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
inline Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
inline Reg widen(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
#endif
constexpr int64_t LANES = sizeof(Reg) / sizeof(float);  // columns per register
constexpr int64_t LINE = 16;                            // columns per pass: one cache line
constexpr int NREG = LINE / LANES;                      // registers per pass: 1 or 2
constexpr int64_t PASSES = BLOCK / LINE;

// One block's accumulators for a group of rows: [weight][pass][row][register] (gate, up).
using Acc = Reg[2][PASSES][ROWS][NREG];

// acc[r * NREG + j] (r < R, j < NREG) += x[r, k0:k1] . W[the pass's 16 columns]: xt is the
// rows' group transposed, [k][ROWS] (one cache line per k), from the pass's first row; w the
// block's first row at the pass's columns.
// Streamed (the weight read from memory, short_linear_f32.cpp): `ahead` is the pass's share
// of the next chunk, one line per k, to prefetch into L2. The pass runs its rows as `groups`
// calls of up to RMAX rows (this one is `group`); each takes every groups-th line of the
// share, so the requests spread over the whole pass: AVX2's 16 rows are 3 calls, and the first
// taking all of them left the line fill buffers idle for the other two (the kernel 0.89-0.90x
// the time at 16 rows over the 0.6B shapes' weights, docs/performance.md, "AVX2 short rows:
// prefetches spread"). Not streamed (a chunk widened into L1, short_linear_w8.cpp): no prefetch.
template <int R, bool streamed>
inline void dot(const float* xt, const float* w, int64_t k0, int64_t k1, const char* ahead, int group, int groups,
                Reg* acc) {
  // acc and c are [R][NREG]: flat, and every loop over them unrolled by pragma, or GCC keeps
  // a copy of c on the stack and stores to it at every k (seen with AVX2's two registers)
  Reg c[R * NREG];
#pragma GCC unroll 32
  for (int q = 0; q < R * NREG; ++q) c[q] = acc[q];
  int turn = group;  // line i - k0 is this call's where (i - k0 + group) % groups == 0
  // unrolled: fewer loop and prefetch-turn instructions per FMA (AVX2's 4-row call issued
  // nearly as many of them as FMAs; 0.95-0.97x the time at 16 rows, AVX-512 0.97-1.0x)
#pragma GCC unroll 4
  for (int64_t i = k0; i < k1; ++i) {
    if constexpr (streamed) {
      if (turn == 0) _mm_prefetch(ahead + (i - k0) * 64, _MM_HINT_T1);
      if (++turn == groups) turn = 0;
      if (group == 0) {
        // the first call brings the pass's line 8 rows on from L2 into L1, so the load below
        // does not wait for it (past the chunk: the next chunk's rows, in L2 by now); the
        // other calls find the chunk in L1
        _mm_prefetch(reinterpret_cast<const char*>(w + (i + 8) * BLOCK), _MM_HINT_T0);
      }
    }
    Reg b[NREG];
#pragma GCC unroll 2
    for (int j = 0; j < NREG; ++j) b[j] = load(w + i * BLOCK + j * LANES);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const Reg a = broadcast(xt + i * ROWS + r);
#pragma GCC unroll 2
      for (int j = 0; j < NREG; ++j) c[r * NREG + j] = fma(a, b[j], c[r * NREG + j]);
    }
  }
#pragma GCC unroll 32
  for (int q = 0; q < R * NREG; ++q) acc[q] = c[q];
}

using Dot = void (*)(const float*, const float*, int64_t, int64_t, const char*, int, int, Reg*);

template <bool streamed, int... R>
constexpr auto dots(std::integer_sequence<int, R...>) {
  return std::array<Dot, sizeof...(R)>{&dot<R + 1, streamed>...};
}
// DOTS[streamed][r - 1]: r rows
constexpr std::array<std::array<Dot, RMAX>, 2> DOTS = {dots<false>(std::make_integer_sequence<int, RMAX>{}),
                                                       dots<true>(std::make_integer_sequence<int, RMAX>{})};

// One block's passes over k rows [k0, k1) for a group of `rows` rows: `w` the block's first
// row (row k0 at w + k0 * BLOCK), `next` the lines to prefetch into L2 (streamed only).
template <bool streamed>
inline void passes(const float* xg, int64_t rows, const float* w, int64_t k0, int64_t k1, const char* next,
                   Reg (*acc)[ROWS][NREG]) {
  const int calls = static_cast<int>((rows + RMAX - 1) / RMAX);
  for (int64_t pass = 0; pass < PASSES; ++pass) {
    const char* ahead = streamed ? next + pass * CHUNK * 64 : nullptr;
    for (int64_t r = 0; r < rows; r += RMAX)  // the group's rows, RMAX at a time
      DOTS[streamed][std::min<int64_t>(RMAX, rows - r) - 1](xg + r, w + pass * LINE, k0, k1, ahead,
                                                            static_cast<int>(r / RMAX), calls, acc[pass][r]);
  }
}

// x's rows in groups of 16, each transposed to [k][16]: rows that sit 4 KB apart would share
// one L1 set, and 16 of them evict each other every k. Filled k outer, rows inner, so the
// stores run in address order (row by row, each store landed in another line of a buffer
// larger than L1, serial before the threads start; docs/performance.md, "fp32 short rows:
// the stream and the FMAs"). A short group's missing rows are never read.
inline std::unique_ptr<float[]> transposed(const float* x, int64_t m, int64_t k, int64_t ldx) {
  const int64_t groups = (m + ROWS - 1) / ROWS;
  std::unique_ptr<float[]> xt(new float[groups * k * ROWS]);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t rows = std::min(ROWS, m - g * ROWS);
    const float* src = x + g * ROWS * ldx;
    float* dst = xt.get() + g * k * ROWS;
    for (int64_t i = 0; i < k; ++i)
      for (int64_t r = 0; r < rows; ++r) dst[i * ROWS + r] = src[r * ldx + i];
  }
  return xt;
}

// A block's results for `rows` rows from r0: acc[0] + bias (or nothing), or gated
// silu(acc[0]) * acc[1], into y's columns of block b.
template <bool gated>
inline void finish(const Acc& acc, int64_t rows, const float* bias, int64_t b, float* y, int64_t ldy) {
  float* yb = y + b * BLOCK;
  for (int64_t pass = 0; pass < PASSES; ++pass) {
    for (int j = 0; j < NREG; ++j) {
      const int64_t col = pass * LINE + j * LANES;
      float* yq = yb + col;
      if constexpr (gated) {
        for (int64_t r = 0; r < rows; ++r) {
          const Vec g(acc[0][pass][r][j]);
          const Vec s = g / (Vec(1.f) + g.neg().exp());
          store(yq + r * ldy, mul(s, acc[1][pass][r][j]));
        }
      } else {
        const Reg bv = bias == nullptr ? zero() : load(bias + b * BLOCK + col);
        for (int64_t r = 0; r < rows; ++r) store(yq + r * ldy, add(acc[0][pass][r][j], bv));
      }
    }
  }
}

inline void clear(Reg (*acc)[ROWS][NREG]) {
  for (int64_t pass = 0; pass < PASSES; ++pass)
    for (auto& row : acc[pass])
      for (auto& a : row) a = zero();
}
#endif

}  // namespace
