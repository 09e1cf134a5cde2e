// Causal flash attention on the CPU in float32 and bfloat16, its matmuls on oneDNN's brgemm.
//
// PyTorch's CPU flash kernel computes its score and output blocks with the BLAS sgemm
// (MKL's, which runs at about half speed on AMD Zen; bf16 runs at its fp32 speed), and it
// reads every KV head once per query head. This kernel keeps flash's shape (online softmax
// over key blocks, nothing of size [queries, keys] in memory) and changes the two:
//
//   * both matmuls of a block go through at::native::cpublas::brgemm, which runs float32 at
//     the machine's matmul speed and bf16 at its bf16 dot-product speed (docs/performance.md,
//     "Where the time went": "fp32 attention: native flash kernel", "bf16 attention: the
//     native kernel too");
//   * the query heads that share a KV head are rows of one tile (GQA without expansion),
//     so each K/V block is read once per tile for all of them.
//
// Per KV head h and tile of R query rows (tasks run in parallel; rows i*groups + g of a
// tile belong to query head h*groups + g):
//   kt      = K_h^T                [d, keys]   packed once per head by each thread (in key blocks)
//     for each key block [k0, k1) up to the tile's last visible key:
//       s    = (scale * q) @ kt[:, k0:k1]                brgemm, fp32 out
//       row r at position p sees keys <= p: the rest of its block is zeroed after exp
//       m, l = running max and sum (fp32); o *= exp(m_old - m_new)
//       o   += exp(s - m) @ V_h[k0:k1]                   brgemm, fp32 accumulation
//     out = o / l
// In bf16, q is scaled then rounded, exp(s - m) is rounded to bf16 for the second matmul
// (the sum l is taken in fp32), and brgemm's B operands (K^T and V, packed per head) are
// in its VNNI layout. Scores, softmax and accumulation stay fp32: closer to float64 than
// the tiled bf16 matmul route (attention/cpu_gemm.py), which rounds scores to bf16. Where
// brgemm has no bf16 (no AVX512_BF16 / AMX), `embedserve_flash_attention_bf16_f32` takes bf16
// in and out and runs the float32 kernel on float32 copies instead.
//
// Query i of n sits at prompt position start + i with start = kv - n (the chunk's keys
// are the last n), and sees keys 0 .. start + i. Built by embedserve/kernels/native.py
// for the machine it runs on (-march=native) and called through ctypes.

#include "cpu_vec.h"  // first: sets the ISA ATen's vec headers compile for
#include "vec_math.h"  // the softmax's exp and sum, rows scaled and rounded

#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

namespace {

using embedserve::convert_row;
using embedserve::exp_and_sum;
using embedserve::row_max;
using embedserve::scale_row;

struct Shape {
  int64_t n, heads, d, kv_heads, kv;
  int64_t q_row, q_head;    // q strides (elements): per query, per head; last dim dense
  int64_t k_head, k_row;    // k strides: per KV head, per key
  int64_t v_head, v_row;    // v strides
  float scale;
};

// Rows of one tile (queries x groups) and keys of one block: a tile's scores (256 KB), its
// queries and output (128 KB each at d = 128) and a K/V block (128 KB each) fit a Zen 4
// core's 1 MB L2.
constexpr int64_t TILE_ROWS = 256;
constexpr int64_t KEY_BLOCK = 256;
// Where every key fits a prompt of SHORT_KEYS, a tile holds at most SHORT_TILE queries: the
// diagonal blocks' masked part and the uneven split of a few tasks over threads shrink with
// the tile, and streaming the few keys once more per tile costs less; over 8K keys the small
// tiles lose, so long prompts keep TILE_ROWS (docs/performance.md, "Flash kernel round").
constexpr int64_t SHORT_KEYS = 4096;
constexpr int64_t SHORT_TILE = 64;

// Keys rounded up to whole key blocks (K^T is kept in whole blocks).
int64_t whole_blocks(int64_t keys) { return (keys + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK; }

// brgemm builds and keeps a kernel (about 0.2 MB) per shape and thread, for the life of the
// process. Tile rows and block keys are rounded up to a multiple of SHAPE_STEP, so any mix
// of prompt lengths meets at most (256 / 64)^2 shapes per matmul: padded score rows and
// columns are zeros, padded V rows come from a zeroed copy.
constexpr int64_t SHAPE_STEP = 64;

int64_t round_up(int64_t x) { return (x + SHAPE_STEP - 1) / SHAPE_STEP * SHAPE_STEP; }

// The kernel's element types: float32, and bfloat16 with fp32 scores, softmax and output
// accumulation (brgemm multiplies bf16 pairs into fp32; its B operand is VNNI-packed:
// element (k, n) at (k / 2) * 2 * ld + n * 2 + k % 2, two consecutive k side by side).
using BF16 = at::BFloat16;
template <typename T>
constexpr bool is_bf16 = std::is_same_v<T, BF16>;

struct Tile {
  std::vector<float> s, o, m, l;
  explicit Tile(int64_t rows, int64_t d)
      : s(round_up(rows) * KEY_BLOCK), o(round_up(rows) * d), m(rows), l(rows) {}
};

// A tile's scaled queries and its probabilities as the matmuls' A operands, in T.
template <typename T>
struct Operands {
  std::vector<T> q, p;  // p: bf16 probabilities (float reads them from the tile's s)
  std::vector<float> v;  // float: a short last block's V rows, zero padded to its shape
  explicit Operands(int64_t rows, int64_t d)
      : q(round_up(rows) * d), p(is_bf16<T> ? round_up(rows) * KEY_BLOCK : 0), v(is_bf16<T> ? 0 : KEY_BLOCK * d) {}
};

// The second matmul's A operand: the tile's scores turned probabilities in place (float), or
// their bfloat16 roundings (bf16).
template <typename T>
T* probabilities(Tile& t, Operands<T>& a) {
  if constexpr (is_bf16<T>) {
    return a.p.data();
  } else {
    return t.s.data();
  }
}

// One tile: query rows [i0, i1) of KV head h. kt is K_h^T in key blocks: block b starts at
// kt + b * d * KEY_BLOCK, [d, KEY_BLOCK] (float) or VNNI [d / 2, KEY_BLOCK, 2] (bf16); one
// leading dimension for every call. bf16: vp is V_h the same way, [KEY_BLOCK / 2, d, 2] per
// block; float reads V_h (v_h) in place.
template <typename T>
void attend_tile(const Shape& sh, const T* q, const T* kt, const T* v_h, const T* vp, T* out, int64_t h,
                 int64_t i0, int64_t i1, Tile& t, Operands<T>& a) {
  const int64_t groups = sh.heads / sh.kv_heads, d = sh.d, start = sh.kv - sh.n;
  const int64_t rows = (i1 - i0) * groups, rows_p = round_up(rows);
  for (int64_t i = i0; i < i1; ++i) {  // pack scale * q: row (i - i0) * groups + g
    for (int64_t g = 0; g < groups; ++g) {
      const T* src = q + i * sh.q_row + (h * groups + g) * sh.q_head;
      scale_row(a.q.data() + ((i - i0) * groups + g) * d, src, d, sh.scale);
    }
  }
  std::fill(a.q.begin() + rows * d, a.q.begin() + rows_p * d, T(0.f));
  std::fill(t.m.begin(), t.m.begin() + rows, -std::numeric_limits<float>::infinity());
  std::fill(t.l.begin(), t.l.begin() + rows, 0.f);
  const int64_t last_key = start + i1;  // keys [0, last_key) are visible to some row
  T* const probs = probabilities(t, a);
  for (int64_t k0 = 0; k0 < last_key; k0 += KEY_BLOCK) {
    const int64_t len = std::min(KEY_BLOCK, last_key - k0), len_p = round_up(len);
    // kt's blocks are whole (zeros past the last key): reading len_p columns stays inside
    at::native::cpublas::brgemm(rows_p, len_p, d, d, KEY_BLOCK, KEY_BLOCK, false, a.q.data(), kt + k0 * d,
                                t.s.data(), is_bf16<T>);
    for (int64_t r = 0; r < rows; ++r) {
      float* s = t.s.data() + r * KEY_BLOCK;
      T* p = probs + r * KEY_BLOCK;
      const int64_t pos = start + i0 + r / groups;
      const int64_t valid = std::min(len, pos - k0 + 1);  // >= 1 in the first block
      if (valid <= 0) {
        std::fill(p, p + len_p, T(0.f));
        continue;
      }
      const float top = std::max(t.m[r], row_max(s, valid));
      const float alpha = std::exp(t.m[r] - top);  // 0 on the first block (m = -inf)
      t.l[r] = t.l[r] * alpha + exp_and_sum(s, p, valid, len_p, top);
      if (k0 > 0 && alpha != 1.f) scale_row(t.o.data() + r * d, t.o.data() + r * d, d, alpha);
      t.m[r] = top;
    }
    std::fill(probs + rows * KEY_BLOCK, probs + rows_p * KEY_BLOCK, T(0.f));
    if constexpr (is_bf16<T>) {  // vp's blocks are whole too (zero rows past the last key)
      at::native::cpublas::brgemm(rows_p, d, len_p, KEY_BLOCK, d, d, k0 > 0, a.p.data(), vp + k0 * d,
                                  t.o.data(), true);
    } else {
      const float* vb = v_h + k0 * sh.v_row;
      int64_t ld_v = sh.v_row;
      if (len_p != len) {  // the block's V rows, then zero rows up to len_p
        for (int64_t j = 0; j < len; ++j) std::copy(vb + j * sh.v_row, vb + j * sh.v_row + d, a.v.data() + j * d);
        std::fill(a.v.begin() + len * d, a.v.begin() + len_p * d, 0.f);
        vb = a.v.data();
        ld_v = d;
      }
      at::native::cpublas::brgemm(rows_p, d, len_p, KEY_BLOCK, ld_v, d, k0 > 0, t.s.data(), vb, t.o.data(),
                                  false);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r / groups, g = r % groups;
    scale_row(out + i * sh.heads * d + (h * groups + g) * d, t.o.data() + r * d, d, 1.f / t.l[r]);
  }
}

// K_h^T in key blocks (see attend_tile) into kt, zeros past the last key.
void transpose_keys(const Shape& sh, const float* k_h, float* kt) {
  for (int64_t j = 0; j < whole_blocks(sh.kv); ++j) {
    float* col = kt + (j / KEY_BLOCK) * sh.d * KEY_BLOCK + j % KEY_BLOCK;
    if (j >= sh.kv) {
      for (int64_t c = 0; c < sh.d; ++c) col[c * KEY_BLOCK] = 0.f;
      continue;
    }
    const float* row = k_h + j * sh.k_row;
    for (int64_t c = 0; c < sh.d; ++c) col[c * KEY_BLOCK] = row[c];
  }
}

// bf16: key j's pair (2c, 2c + 1) is one 32-bit word, at word c * KEY_BLOCK + j % KEY_BLOCK
// of j's block: a transpose of [keys, d / 2] words.
void transpose_keys(const Shape& sh, const BF16* k_h, BF16* kt) {
  const int64_t pairs = sh.d / 2;
  for (int64_t j = 0; j < whole_blocks(sh.kv); ++j) {
    BF16* col = kt + (j / KEY_BLOCK) * sh.d * KEY_BLOCK + 2 * (j % KEY_BLOCK);  // word j % KEY_BLOCK
    const BF16* row = j < sh.kv ? k_h + j * sh.k_row : nullptr;  // keys past kv: zero words
    for (int64_t c = 0; c < pairs; ++c) {
      uint32_t word = 0;
      if (row != nullptr) std::memcpy(&word, row + 2 * c, sizeof word);
      std::memcpy(col + 2 * c * KEY_BLOCK, &word, sizeof word);  // bf16 storage: copied, not punned
    }
  }
}

// bf16: V_h in VNNI key blocks into vp, zero rows past the last key.
void pack_values(const Shape& sh, const BF16* v_h, BF16* vp) {
  const int64_t d = sh.d;
  for (int64_t j = 0; j < whole_blocks(sh.kv); j += 2) {  // keys j and j + 1 interleaved: [d, 2]
    BF16* dst = vp + (j / KEY_BLOCK) * KEY_BLOCK * d + ((j % KEY_BLOCK) / 2) * 2 * d;
    const BF16* a = j < sh.kv ? v_h + j * sh.v_row : nullptr;
    const BF16* b = j + 1 < sh.kv ? v_h + (j + 1) * sh.v_row : nullptr;
    int64_t c = 0;
#ifdef EMBEDSERVE_AVX512
    if (a != nullptr && b != nullptr) {  // 32 columns of both rows -> 64 interleaved values
      const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                                          38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
      const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
      for (; c + 32 <= d; c += 32) {
        const __m512i x = _mm512_loadu_si512(a + c), y = _mm512_loadu_si512(b + c);
        _mm512_storeu_si512(dst + 2 * c, _mm512_permutex2var_epi16(x, lo, y));
        _mm512_storeu_si512(dst + 2 * c + 32, _mm512_permutex2var_epi16(x, hi, y));
      }
    }
#endif
    for (; c < d; ++c) {
      dst[2 * c] = a != nullptr ? a[c] : BF16(0.f);
      dst[2 * c + 1] = b != nullptr ? b[c] : BF16(0.f);
    }
  }
}

// All (KV head, tile) tasks on ATen's thread pool. Tasks are head-major and a thread's share
// of the range is contiguous, so it packs each head it meets once into its own kt (and vp).
// Within a head later tiles see more keys: tiles run 0, T-1, 1, T-2, ... so a share cut
// inside a head stays balanced.
template <typename T>
void run(const Shape& sh, const T* q, const T* k, const T* v, T* out) {
  const int64_t groups = sh.heads / sh.kv_heads;
  const int64_t most = std::max<int64_t>(1, TILE_ROWS / groups);
  const int64_t tile = sh.kv <= SHORT_KEYS ? std::min(SHORT_TILE, most) : most;  // queries per tile
  const int64_t tiles = (sh.n + tile - 1) / tile;
  const int64_t head_size = whole_blocks(sh.kv) * sh.d;
  at::parallel_for(0, sh.kv_heads * tiles, 1, [&](int64_t a, int64_t b) {
    Tile t(tile * groups, sh.d);
    Operands<T> ops(tile * groups, sh.d);
    std::unique_ptr<T[]> kt(new T[head_size]);  // written whole per head
    std::unique_ptr<T[]> vp(is_bf16<T> ? new T[head_size] : nullptr);
    int64_t have = -1;
    for (int64_t x = a; x < b; ++x) {
      const int64_t h = x / tiles, y = x % tiles;
      if (h != have) {
        transpose_keys(sh, k + h * sh.k_head, kt.get());
        if constexpr (is_bf16<T>) pack_values(sh, v + h * sh.v_head, vp.get());
      }
      have = h;
      const int64_t which = (y % 2 == 0) ? y / 2 : tiles - 1 - y / 2;
      const int64_t i0 = which * tile, i1 = std::min(sh.n, i0 + tile);
      attend_tile<T>(sh, q, kt.get(), v + h * sh.v_head, vp.get(), out, h, i0, i1, t, ops);
    }
    if constexpr (is_bf16<T>) at::native::cpublas::brgemm_release(true);  // AMX tiles, where used
  });
}

// 0: done; 1: shapes refused; 2: an exception (out of memory, a oneDNN error), which must
// not unwind into ctypes. The caller raises for both.
template <typename T>
int entry(const T* q, const T* k, const T* v, T* out, const int64_t* dims, const int64_t* strides, float scale) {
  // dims: n, heads, d, kv_heads, kv; strides: q_row, q_head, k_head, k_row, v_head, v_row
  const Shape sh{dims[0], dims[1], dims[2], dims[3], dims[4], strides[0], strides[1],
                 strides[2], strides[3], strides[4], strides[5], scale};
  if (sh.n < 1 || sh.kv < sh.n || sh.d < 1 || sh.heads < 1 || sh.kv_heads < 1 ||
      sh.heads % sh.kv_heads != 0 || (is_bf16<T> && sh.d % 2 != 0))  // VNNI pairs head_dim
    return 1;
  try {
    run<T>(sh, q, k, v, out);
  } catch (...) {
    return 2;
  }
  return 0;
}

// bfloat16 in and out, float32 math throughout: for CPUs whose brgemm has no bf16 (no
// AVX512_BF16 or AMX: AVX2-only, Skylake-X). q, k and v become dense float32 copies (exact),
// the float32 kernel runs on them, its output is rounded to bf16 once. The copies cost
// O((n + kv) * heads * d) against the attention's O(n * kv * heads * d).
int entry_via_f32(const BF16* q, const BF16* k, const BF16* v, BF16* out, const int64_t* dims,
                  const int64_t* strides, float scale) {
  const Shape in{dims[0], dims[1], dims[2], dims[3], dims[4], strides[0], strides[1],
                 strides[2], strides[3], strides[4], strides[5], scale};
  if (in.n < 1 || in.kv < in.n || in.d < 1 || in.heads < 1 || in.kv_heads < 1 || in.heads % in.kv_heads != 0)
    return 1;
  const int64_t d = in.d, q_size = in.n * in.heads * d, kv_size = in.kv * in.kv_heads * d;
  try {
    std::vector<float> qf(q_size), kf(kv_size), vf(kv_size), of(q_size);
    // dense copies: q [n][heads][d], k and v [kv][kv_heads][d]
    at::parallel_for(0, in.n * in.heads, 64, [&](int64_t a, int64_t b) {
      for (int64_t x = a; x < b; ++x)
        convert_row(q + (x / in.heads) * in.q_row + (x % in.heads) * in.q_head, qf.data() + x * d, d);
    });
    at::parallel_for(0, in.kv * in.kv_heads, 64, [&](int64_t a, int64_t b) {
      for (int64_t x = a; x < b; ++x) {
        const int64_t j = x / in.kv_heads, h = x % in.kv_heads;
        convert_row(k + h * in.k_head + j * in.k_row, kf.data() + x * d, d);
        convert_row(v + h * in.v_head + j * in.v_row, vf.data() + x * d, d);
      }
    });
    const int64_t kv_row = in.kv_heads * d;
    const Shape dense{in.n, in.heads, d, in.kv_heads, in.kv, in.heads * d, d, d, kv_row, d, kv_row, scale};
    run<float>(dense, qf.data(), kf.data(), vf.data(), of.data());
    at::parallel_for(0, in.n, 16, [&](int64_t a, int64_t b) {
      convert_row(of.data() + a * in.heads * d, out + a * in.heads * d, (b - a) * in.heads * d);
    });
  } catch (...) {
    return 2;
  }
  return 0;
}

}  // namespace

extern "C" int embedserve_flash_attention_f32(const float* q, const float* k, const float* v, float* out,
                                              const int64_t* dims, const int64_t* strides, float scale) {
  return entry<float>(q, k, v, out, dims, strides, scale);
}

extern "C" int embedserve_flash_attention_bf16(const BF16* q, const BF16* k, const BF16* v, BF16* out,
                                               const int64_t* dims, const int64_t* strides, float scale) {
  return entry<BF16>(q, k, v, out, dims, strides, scale);
}

extern "C" int embedserve_flash_attention_bf16_f32(const BF16* q, const BF16* k, const BF16* v, BF16* out,
                                                   const int64_t* dims, const int64_t* strides, float scale) {
  return entry_via_f32(q, k, v, out, dims, strides, scale);
}
