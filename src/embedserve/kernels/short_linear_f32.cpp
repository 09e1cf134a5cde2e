// float32 linear layers for a few rows (short queries) with AVX-512 or AVX2 FMAs, reading the
// weight oneDNN packed (models/linear.py `prepack`) in place: the float32 sibling of
// short_linear.cpp. The passes themselves are short_f32.h's.
//
// oneDNN's float32 packing, for N % 64 == 0, is [N/64][K][64] (with AVX2 and AVX-512 alike):
// per block of 64 output columns, K rows of 64 floats, the layout short_f32.h's passes read.
// Each pass prefetches its share of the next chunk into L2, spread over the pass's calls of up
// to 6 / 16 rows (each call's lines in address order).
// Passes over whole blocks instead read every fourth cache line, a stride the hardware
// prefetchers do not follow: the misses then wait one by one (slower than oneDNN; with this
// order faster, docs/performance.md, "Short rows on their own kernels"). Each pass also
// prefetches its own line 8 k ahead from L2 into L1, so its loads no longer wait on L2
// (docs/performance.md, "fp32 short rows: the stream and the FMAs").
//
//   y[m, n] = x[m, :] . W[n, :] + bias[n]                  (`embedserve_short_linear_f32`)
//   y[m, n] = silu(x . G[n]) * (x . U[n])                  (`embedserve_short_silu_gate_up_f32`)
//
// Built by embedserve/kernels/native.py.

#include "short_f32.h"  // first: cpu_vec.h sets the ISA ATen's vec headers compile for

namespace {

#ifdef EMBEDSERVE_SHORT_F32
template <bool gated>
void run(const float* x, int64_t m, int64_t k, int64_t ldx, const float* w, const float* u, const float* bias,
         int64_t n, float* y, int64_t ldy) {
  const std::unique_ptr<float[]> xt = transposed(x, m, k, ldx);
  at::parallel_for(0, n / BLOCK, 1, [&](int64_t b0, int64_t b1) {
    alignas(64) Acc acc;
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
        const int64_t rows = std::min(ROWS, m - r0);
        const float* xg = xt.get() + (r0 / ROWS) * k * ROWS;
        for (int wi = 0; wi < (gated ? 2 : 1); ++wi) {
          const float* wb = (wi == 0 ? w : u) + b * k * BLOCK;
          clear(acc[wi]);
          // k in chunks whose rows (CHUNK x 256 bytes) stay in L1 across the block's passes;
          // each pass prefetches its share of the next chunk, in order
          for (int64_t k0 = 0; k0 < k; k0 += CHUNK) {
            const int64_t k1 = std::min(k, k0 + CHUNK);
            // the rows after this chunk: the next chunk, or after the last one the next
            // block's first (blocks follow each other; a prefetch past the end never faults)
            passes<true>(xg, rows, wb, k0, k1, reinterpret_cast<const char*>(wb + k1 * BLOCK), acc[wi]);
          }
        }
        finish<gated>(acc, rows, bias, b, y + r0 * ldy, ldy);
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
