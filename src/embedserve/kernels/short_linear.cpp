// bfloat16 linear layers for a few rows (short queries) on Intel AMX, reading the weight oneDNN
// packed (models/linear.py `prepack`) in place: no second copy of any weight. The float32
// sibling, on AVX-512 FMAs: short_linear_f32.cpp.
//
// At a few rows a projection is a read of its weight: 16 rows of the 0.6B shape stream 881 MB
// of weights for 14 GFLOP, which AMX computes in a fraction of the read. oneDNN's matmul on
// those rows reads well under the machine's bandwidth (its kernels for few rows are cut for
// reuse, not for one pass over cold weights); this loop reads one sequential stream per
// thread at the machine's bandwidth (docs/performance.md, "Short rows on their own kernels").
//
// The packed layout, for N % 32 == 0 and K % 32 == 0, is [N/32][K/2][32][2]: per block of 32
// output columns, K/2 rows of 32 (k, k+1) pairs, the VNNI form AMX's B operand takes. The
// caller checks it against the plain weight before using this (kernels/short_linear.py).
//
//   y[m, n] = round(x[m, :] . W[n, :] + bias[n])                   (`embedserve_short_linear_bf16`)
//   y[m, n] = round(round(silu(x . G[n])) * (x . U[n]))            (`embedserve_short_silu_gate_up_bf16`)
//
// Sums are float32 over k ascending in steps of 32 (a tile), one rounding to bfloat16 at the
// end (what oneDNN's AMX matmul gives: the same bits, checked by the tests); the gated form
// rounds where oneDNN's swish and product epilogues round. Built by embedserve/kernels/native.py.

#include "cpu_vec.h"  // first: sets the ISA ATen's vec headers compile for

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define EMBEDSERVE_AMX 1
#endif

namespace {

using BF16 = at::BFloat16;
constexpr int64_t BLOCK = 32;  // output columns per packed block
constexpr int64_t KSTEP = 32;  // k per tile step: 16 (k, k+1) pairs
constexpr int64_t ROWS = 16;   // rows per A tile

#ifdef EMBEDSERVE_AMX
using Vec = at::vec::Vectorized<float>;

// Linux hands a process AMX's tile state only when asked (once per process; oneDNN asks too).
bool amx_permitted() {
  static const bool ok = [] {
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: accumulators (m rows x 16 floats); 4: A (m rows x 32 bf16); 5-7: B (16 pairs x 16 x 2).
void configure(int64_t m) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(t >= 5 ? 16 : m);
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// 16 floats rounded to nearest even bfloat16 and stored.
inline void store16(BF16* dst, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)_mm512_cvtneps_pbh(v));
}

inline __m512 round_bf16(__m512 v) {
  return _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(v));
}

// acc [m][BLOCK] floats (+ bias) rounded into m rows of y.
void store_block(const float* acc, int64_t m, const BF16* bias, BF16* y, int64_t ldy) {
  __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
  if (bias != nullptr) {
    b0 = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias)));
    b1 = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias + 16)));
  }
  for (int64_t r = 0; r < m; ++r) {
    store16(y + r * ldy, _mm512_add_ps(_mm512_loadu_ps(acc + r * BLOCK), b0));
    store16(y + r * ldy + 16, _mm512_add_ps(_mm512_loadu_ps(acc + r * BLOCK + 16), b1));
  }
}

// silu(g) rounded, times u, rounded: oneDNN's swish then binary-mul epilogues.
void store_gated(const float* gate, const float* up, int64_t m, BF16* y, int64_t ldy) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < BLOCK; c += 16) {
      const Vec g = Vec::loadu(gate + r * BLOCK + c);
      const Vec s = g / (Vec(1.f) + g.neg().exp());
      const __m512 sr = round_bf16(s);
      store16(y + r * ldy + c, _mm512_mul_ps(sr, _mm512_loadu_ps(up + r * BLOCK + c)));
    }
  }
}

// Accumulates x[rows, :] . WA and . WB (two blocks of 32 columns each) into tiles 0, 1 and 2, 3
// (a macro: the tile intrinsics take register numbers as literals). Each A tile (16 rows of x,
// from L2 when x is wider than what L1 keeps beside the stream) is loaded once for both; WB's
// second half reuses tile 5 once WA's product has read it (tiles are not renamed).
#define EMBEDSERVE_DOT_TWO(x, ldx, wa, wb, k)                \
  do {                                                      \
    _tile_zero(0);                                          \
    _tile_zero(1);                                          \
    _tile_zero(2);                                          \
    _tile_zero(3);                                          \
    for (int64_t s = 0; s < (k); s += KSTEP) {              \
      const BF16* ta = (wa) + s * BLOCK;                    \
      const BF16* tb = (wb) + s * BLOCK;                    \
      _tile_loadd(4, (x) + s, (ldx) * 2);                   \
      _tile_loadd(5, ta, BLOCK * 4);                        \
      _tile_loadd(6, ta + 32, BLOCK * 4);                   \
      _tile_loadd(7, tb, BLOCK * 4);                        \
      _tile_dpbf16ps(0, 4, 5);                              \
      _tile_dpbf16ps(1, 4, 6);                              \
      _tile_dpbf16ps(2, 4, 7);                              \
      _tile_loadd(5, tb + 32, BLOCK * 4);                   \
      _tile_dpbf16ps(3, 4, 5);                              \
    }                                                       \
  } while (0)

// Tiles 0-3 into acc[0] (tiles 0, 1) and acc[1] (2, 3).
void store_tiles(float (*acc)[ROWS * BLOCK]) {
  _tile_stored(0, acc[0], BLOCK * 4);
  _tile_stored(1, acc[0] + 16, BLOCK * 4);
  _tile_stored(2, acc[1], BLOCK * 4);
  _tile_stored(3, acc[1] + 16, BLOCK * 4);
}

// Blocks two at a time (a gated projection's G and U block; a plain one's block and the next),
// so each A tile, loaded from L2 once x is wider than what L1 keeps beside the weight stream,
// serves both: nearer the streaming floor at 16 and 64 rows, the same at 1 row
// (docs/performance.md, "fp32 short rows: the stream and the FMAs", "The bf16 stream").
template <bool gated>
void run(const BF16* x, int64_t m, int64_t k, int64_t ldx, const BF16* w, const BF16* u, const BF16* bias,
         int64_t n, BF16* y, int64_t ldy) {
  at::parallel_for(0, n / BLOCK, 1, [&](int64_t b0, int64_t b1) {
    alignas(64) float acc[2][ROWS * BLOCK];
    int64_t configured = -1;
    for (int64_t b = b0; b < b1;) {  // the blocks' weights stay in L2 across the row groups
      const int64_t blocks = gated || b + 1 == b1 ? 1 : 2;
      for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
        const int64_t rows = std::min(ROWS, m - r0);
        if (rows != configured) {
          configure(rows);
          configured = rows;
        }
        const BF16* xr = x + r0 * ldx;
        const BF16* wb = w + b * k * BLOCK;
        BF16* yb = y + r0 * ldy + b * BLOCK;
        const BF16* bb = bias == nullptr ? nullptr : bias + b * BLOCK;
        if constexpr (gated) {
          EMBEDSERVE_DOT_TWO(xr, ldx, wb, u + b * k * BLOCK, k);
          store_tiles(acc);
          store_gated(acc[0], acc[1], rows, yb, ldy);
        } else {  // a thread's last block alone: read twice, from L1 the second time
          EMBEDSERVE_DOT_TWO(xr, ldx, wb, wb + (blocks - 1) * k * BLOCK, k);
          store_tiles(acc);
          store_block(acc[0], rows, bb, yb, ldy);
          if (blocks == 2) store_block(acc[1], rows, bb == nullptr ? nullptr : bb + BLOCK, yb + BLOCK, ldy);
        }
      }
      b += blocks;
    }
    _tile_release();
  });
}
#endif

// 0: done; 1: not built for AMX here or the OS refused AMX's state; 2: shapes it does not take.
int check(int64_t m, int64_t k, int64_t ldx, int64_t n, int64_t ldy) {
#ifdef EMBEDSERVE_AMX
  if (!amx_permitted()) return 1;
  if (m < 1 || k < KSTEP || k % KSTEP || n < BLOCK || n % BLOCK || ldx < k || ldy < n) return 2;
  return 0;
#else
  return 1;
#endif
}

// Both entry points: checked, then run (gated: `w2` is U, else `w2` is the bias or null).
template <bool gated>
int entry(const BF16* x, int64_t m, int64_t k, int64_t ldx, const BF16* w, const BF16* w2, int64_t n, BF16* y,
          int64_t ldy) {
  const int rc = check(m, k, ldx, n, ldy);
#ifdef EMBEDSERVE_AMX
  if (rc == 0) run<gated>(x, m, k, ldx, w, gated ? w2 : nullptr, gated ? nullptr : w2, n, y, ldy);
#endif
  return rc;
}

}  // namespace

extern "C" int embedserve_short_linear_bf16(const BF16* x, int64_t m, int64_t k, int64_t ldx, const BF16* w,
                                            const BF16* bias, int64_t n, BF16* y, int64_t ldy) {
  return entry<false>(x, m, k, ldx, w, bias, n, y, ldy);
}

extern "C" int embedserve_short_silu_gate_up_bf16(const BF16* x, int64_t m, int64_t k, int64_t ldx,
                                                  const BF16* gate, const BF16* up, int64_t n, BF16* y, int64_t ldy) {
  return entry<true>(x, m, k, ldx, gate, up, n, y, ldy);
}
