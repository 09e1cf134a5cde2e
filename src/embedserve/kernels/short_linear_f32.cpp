// float32 linear layers for a few rows (short queries) with AVX-512 or AVX2 FMAs, reading the
// weight oneDNN packed (models/linear.py `prepack`) in place: the float32 sibling of
// short_linear.cpp.
//
// oneDNN's float32 packing, for N % 64 == 0, is [N/64][K][64] (with AVX2 and AVX-512 alike):
// per block of 64 output columns, K rows of 64 floats. A pass takes 16 of those columns (one
// cache line: one AVX-512 register or two AVX2 ones) for up to 16 input rows (AVX2: 6 at a
// time, of its 16 registers): per k one load of the line and one FMA per row and register with
// x[r, k] broadcast, the accumulators in registers. k runs in chunks of 64 rows (16 KB): the block's passes read a
// chunk from L1, and each prefetches its share of the next chunk into L2, spread over the
// pass's calls of up to 6 / 16 rows (each call's lines in address order).
// Passes over whole blocks instead read every fourth cache line, a stride the hardware
// prefetchers do not follow: the misses then wait one by one (slower than oneDNN; with this
// order faster, docs/performance.md, "Short rows on their own kernels"). Each pass also
// prefetches its own line 8 k ahead from L2 into L1, so its loads no longer wait on L2
// (docs/performance.md, "fp32 short rows: the stream and the FMAs").
//
//   y[m, n] = x[m, :] . W[n, :] + bias[n]                  (`embedserve_short_linear_f32`)
//   y[m, n] = silu(x . G[n]) * (x . U[n])                  (`embedserve_short_silu_gate_up_f32`)
//
// Sums are float32 FMAs over k in order, whatever the ISA. Built by embedserve/kernels/native.py.

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
#endif
constexpr int64_t LANES = sizeof(Reg) / sizeof(float);  // columns per register
constexpr int64_t LINE = 16;                            // columns per pass: one cache line
constexpr int NREG = LINE / LANES;                      // registers per pass: 1 or 2
constexpr int64_t PASSES = BLOCK / LINE;

// acc[r * NREG + j] (r < R, j < NREG) += x[r, k0:k1] . W[the pass's 16 columns]: xt is the
// rows' group transposed, [k][ROWS] (one cache line per k), from the pass's first row; w the
// block's first row at the pass's columns; `ahead` is the pass's share of the next chunk, one
// line per k, to prefetch into L2. The pass runs its rows as `groups` calls of up to RMAX rows
// (this one is `group`); each takes every groups-th line of the share, so the requests spread
// over the whole pass: AVX2's 16 rows are 3 calls, and the first taking all of them left the
// line fill buffers idle for the other two (the kernel 0.89-0.90x the time at 16 rows over
// the 0.6B shapes' weights, docs/performance.md, "AVX2 short rows: prefetches spread").
template <int R>
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
    if (turn == 0) _mm_prefetch(ahead + (i - k0) * 64, _MM_HINT_T1);
    if (++turn == groups) turn = 0;
    if (group == 0) {
      // the first call brings the pass's line 8 rows on from L2 into L1, so the load below
      // does not wait for it (past the chunk: the next chunk's rows, in L2 by now); the
      // other calls find the chunk in L1
      _mm_prefetch(reinterpret_cast<const char*>(w + (i + 8) * BLOCK), _MM_HINT_T0);
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

template <int... R>
constexpr auto dots(std::integer_sequence<int, R...>) {
  return std::array<Dot, sizeof...(R)>{&dot<R + 1>...};
}
constexpr auto DOTS = dots(std::make_integer_sequence<int, RMAX>{});  // DOTS[r - 1]: r rows

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
    alignas(64) Reg acc[2][PASSES][ROWS][NREG];  // [weight][pass][row][register]: gate, up
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
        const int64_t rows = std::min(ROWS, m - r0);
        const float* xg = xt.get() + (r0 / ROWS) * k * ROWS;
        for (int wi = 0; wi < (gated ? 2 : 1); ++wi) {
          const float* wb = (wi == 0 ? w : u) + b * k * BLOCK;
          for (auto& pass : acc[wi])
            for (auto& row : pass)
              for (auto& a : row) a = zero();
          // k in chunks whose rows (CHUNK x 256 bytes) stay in L1 across the block's passes;
          // each pass prefetches its share of the next chunk, in order
          const int calls = static_cast<int>((rows + RMAX - 1) / RMAX);
          for (int64_t k0 = 0; k0 < k; k0 += CHUNK) {
            const int64_t k1 = std::min(k, k0 + CHUNK);
            // the rows after this chunk: the next chunk, or after the last one the next
            // block's first (blocks follow each other; a prefetch past the end never faults)
            const char* next = reinterpret_cast<const char*>(wb + k1 * BLOCK);
            for (int64_t pass = 0; pass < PASSES; ++pass) {
              const char* ahead = next + pass * CHUNK * 64;
              for (int64_t r = 0; r < rows; r += RMAX)  // the group's rows, RMAX at a time
                DOTS[std::min<int64_t>(RMAX, rows - r) - 1](xg + r, wb + pass * LINE, k0, k1, ahead,
                                                             static_cast<int>(r / RMAX), calls, acc[wi][pass][r]);
            }
          }
        }
        float* yb = y + r0 * ldy + b * BLOCK;
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
    }
  });
}
#endif

// 0: done; 1: built here without AVX-512 or AVX2 + FMA; 2: shapes it does not take.
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

// The floats per register the passes were built with here: 16 (AVX-512), 8 (AVX2), 0 (neither).
extern "C" int embedserve_short_f32_lanes() {
#ifdef EMBEDSERVE_SHORT_F32
  return static_cast<int>(LANES);
#else
  return 0;
#endif
}
