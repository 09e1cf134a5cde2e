// Linear layers for a few rows over int8 weights (weight-only int8: GGUF's Q8_0 as stored, or
// `quantization="int8-weights"`), float32 arithmetic: a short query on a large model reads
// every weight once, and one byte per weight is a quarter of float32's stream.
//
// The weight is int8 in short_f32.h's layout, [N/64][K][64], with float32 scales laid out
// alike, [N/64][K/G][64] (G: the scale group along k; K for one scale per output channel, 32
// for Q8_0), so that rows [a, b) of a weight are blocks [a/64, b/64) of both:
//
//   W[n, k] = float(q[n, k]) * scale[n, k / G]        (one float32 rounding, as dequantizing does)
//   y[m, n] = x[m, :] . W[n, :] + bias[n]             (`embedserve_short_linear_w8`)
//   y[m, n] = silu(x . G[n]) * (x . U[n])             (`embedserve_short_silu_gate_up_w8`)
//
// Per block of 64 output columns and chunk of 64 k rows, the chunk's 4 KB of int8 are widened
// and scaled into a 16 KB float32 buffer in L1 (prefetching the next chunk's lines meanwhile),
// then short_f32.h's passes run every group of rows over the buffer. The FMAs are the float32
// kernel's, over k in order: the bits are short_linear_f32.cpp's on the dequantized weight.
// Built by embedserve/kernels/native.py.

#include "short_f32.h"  // first: cpu_vec.h sets the ISA ATen's vec headers compile for

namespace {

constexpr int64_t MAX_ROWS = 64;  // rows per call: 4 groups of accumulators per thread

#ifdef EMBEDSERVE_SHORT_F32
// Rows [k0, k1) of a block (its first row `qb`, its scales' `sb`) as floats, scaled, into
// buf[(i - k0) * 64];
// the next chunk's lines (the same block's, or after its last row the next block's first:
// blocks follow each other) are prefetched into L1 one per row widened.
inline void widen_chunk(const int8_t* qb, const float* sb, int64_t group, int64_t k0, int64_t k1, float* buf) {
  const char* next = reinterpret_cast<const char*>(qb + k1 * BLOCK);
  for (int64_t i = k0; i < k1; ++i) {
    _mm_prefetch(next + (i - k0) * BLOCK, _MM_HINT_T0);
    const int8_t* src = qb + i * BLOCK;
    const float* s = sb + (i / group) * BLOCK;
    float* dst = buf + (i - k0) * BLOCK;
#pragma GCC unroll 8
    for (int64_t j = 0; j < BLOCK; j += LANES) store(dst + j, mul(widen(src + j), load(s + j)));
  }
}

template <bool gated>
void run(const float* x, int64_t m, int64_t k, int64_t ldx, const int8_t* w, const float* ws, const int8_t* u,
         const float* us, int64_t group, const float* bias, int64_t n, float* y, int64_t ldy) {
  const std::unique_ptr<float[]> xt = transposed(x, m, k, ldx);
  const int64_t groups = (m + ROWS - 1) / ROWS;
  at::parallel_for(0, n / BLOCK, 1, [&](int64_t b0, int64_t b1) {
    alignas(64) Acc acc[MAX_ROWS / ROWS];
    alignas(64) float buf[CHUNK * BLOCK];
    for (int64_t b = b0; b < b1; ++b) {
      for (int wi = 0; wi < (gated ? 2 : 1); ++wi) {
        const int8_t* qb = (wi == 0 ? w : u) + b * k * BLOCK;
        const float* sb = (wi == 0 ? ws : us) + b * (k / group) * BLOCK;
        for (int64_t g = 0; g < groups; ++g) clear(acc[g][wi]);
        for (int64_t k0 = 0; k0 < k; k0 += CHUNK) {
          const int64_t k1 = std::min(k, k0 + CHUNK);
          widen_chunk(qb, sb, group, k0, k1, buf);  // once for every row
          for (int64_t g = 0; g < groups; ++g)
            passes<false>(xt.get() + (g * k + k0) * ROWS, std::min(ROWS, m - g * ROWS), buf, 0, k1 - k0, nullptr,
                          acc[g][wi]);
        }
      }
      for (int64_t g = 0; g < groups; ++g)
        finish<gated>(acc[g], std::min(ROWS, m - g * ROWS), bias, b, y + g * ROWS * ldy, ldy);
    }
  });
}
#endif

// 0: done; 1: built here without AVX-512 or AVX2 + FMA; 2: shapes it does not take.
int check(int64_t m, int64_t k, int64_t ldx, int64_t group, int64_t n, int64_t ldy) {
#ifdef EMBEDSERVE_SHORT_F32
  if (m < 1 || m > MAX_ROWS || k < 1 || n < BLOCK || n % BLOCK || ldx < k || ldy < n) return 2;
  if (group < 1 || k % group) return 2;
  return 0;
#else
  return 1;
#endif
}

// Both entry points: checked, then run; 3 when the run threw (the rows' buffer not
// allocated): nothing is thrown into ctypes.
template <bool gated>
int entry(const float* x, int64_t m, int64_t k, int64_t ldx, const int8_t* w, const float* ws, const int8_t* u,
          const float* us, int64_t group, const float* bias, int64_t n, float* y, int64_t ldy) {
  const int rc = check(m, k, ldx, group, n, ldy);
#ifdef EMBEDSERVE_SHORT_F32
  if (rc == 0) {
    try {
      run<gated>(x, m, k, ldx, w, ws, u, us, group, bias, n, y, ldy);
    } catch (...) {
      return 3;
    }
  }
#endif
  return rc;
}

}  // namespace

// A weight as short_forward.cpp passes one (a pointer where the float32 kernel takes its packed
// weight): the entry points below with the float32 ones' signatures.
struct W8 {
  const int8_t* q;
  const float* scales;
  int64_t group;
};

extern "C" int embedserve_short_linear_w8(const float* x, int64_t m, int64_t k, int64_t ldx, const int8_t* w,
                                           const float* scales, int64_t group, const float* bias, int64_t n, float* y,
                                           int64_t ldy) {
  return entry<false>(x, m, k, ldx, w, scales, nullptr, nullptr, group, bias, n, y, ldy);
}

extern "C" int embedserve_short_silu_gate_up_w8(const float* x, int64_t m, int64_t k, int64_t ldx,
                                                 const int8_t* gate, const float* gate_scales, const int8_t* up,
                                                 const float* up_scales, int64_t group, int64_t n, float* y,
                                                 int64_t ldy) {
  return entry<true>(x, m, k, ldx, gate, gate_scales, up, up_scales, group, nullptr, n, y, ldy);
}

extern "C" int embedserve_short_linear_w8_ref(const float* x, int64_t m, int64_t k, int64_t ldx, const W8* w,
                                               const float* bias, int64_t n, float* y, int64_t ldy) {
  return entry<false>(x, m, k, ldx, w->q, w->scales, nullptr, nullptr, w->group, bias, n, y, ldy);
}

extern "C" int embedserve_short_silu_gate_up_w8_ref(const float* x, int64_t m, int64_t k, int64_t ldx, const W8* gate,
                                                     const W8* up, int64_t n, float* y, int64_t ldy) {
  if (gate->group != up->group) return 2;
  return entry<true>(x, m, k, ldx, gate->q, gate->scales, up->q, up->scales, gate->group, nullptr, n, y, ldy);
}
