// RMSNorm, the residual add before it, and Qwen3's per-head q/k norm with rotary embedding,
// in float32 on the CPU, each one pass over its rows.
//
// In PyTorch each of these is a chain of elementwise ops (pow, mean, rsqrt, mul, mul; cat,
// neg, mul, mul, add for RoPE), every one a pass over the activations into a fresh tensor
// whose pages fault in. Here a row is read once, reduced and written once:
//
//   add_rms_norm: x += residual (in place, optional), out = weight * x * rsqrt(mean(x^2) + eps)
//   qk_norm_rope: per head of the fused q|k|v projection, in place on q and k:
//                 x = weight * x * rsqrt(mean(x^2) + eps)   (Qwen3; skipped without weights)
//                 x = x * cos + rotate_half(x) * sin        (rotate_half(x) = [-x2, x1])
//
// The arithmetic is Hugging Face's in float32 (the order of the sum of squares and fused
// multiply-adds aside: about one rounding). Built by embedserve/kernels/native.py.

#include "cpu_vec.h"  // first: sets the ISA ATen's vec headers compile for

#include <cmath>
#include <cstdint>

namespace {

using Vec = at::vec::Vectorized<float>;

constexpr int64_t GRAIN = 16;  // rows per task at least

// dst = w * src * rsqrt(mean(src^2) + eps) over n floats (dst may be src).
void rms_row(float* dst, const float* src, const float* w, int64_t n, float eps) {
  const float squares = at::vec::map_reduce_all<float>(
      [](Vec x) { return x * x; }, [](Vec a, Vec b) { return a + b; }, src, n);
  const float inv = 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
  at::vec::map2([inv](Vec x, Vec wv) { return wv * (x * Vec(inv)); }, dst, src, w, n);
}

// x = x * cos + rotate_half(x) * sin over one head of d floats, in place; cos and sin are
// the row's [d] tables (their halves are equal, as rotary tables are built).
void rope_row(float* x, const float* cos, const float* sin, int64_t d) {
  const int64_t half = d / 2;
  int64_t c = 0;
  for (; c + Vec::size() <= half; c += Vec::size()) {
    const Vec x1 = Vec::loadu(x + c), x2 = Vec::loadu(x + half + c);
    (x1 * Vec::loadu(cos + c) - x2 * Vec::loadu(sin + c)).store(x + c);
    (x2 * Vec::loadu(cos + half + c) + x1 * Vec::loadu(sin + half + c)).store(x + half + c);
  }
  for (; c < half; ++c) {
    const float x1 = x[c], x2 = x[half + c];
    x[c] = x1 * cos[c] - x2 * sin[c];
    x[half + c] = x2 * cos[half + c] + x1 * sin[half + c];
  }
}

}  // namespace

// x [rows, n] (rows x_stride apart), residual [rows, n] dense or null, out [rows, n] dense.
// 0: done; 1: shapes refused; 2: an exception, which must not unwind into ctypes.
extern "C" int embedserve_add_rms_norm_f32(float* x, int64_t x_stride, const float* residual, float* out,
                                           const float* weight, int64_t rows, int64_t n, float eps) {
  if (rows < 0 || n < 1 || x_stride < n) return 1;
  try {
    at::parallel_for(0, rows, GRAIN, [&](int64_t a, int64_t b) {
      for (int64_t r = a; r < b; ++r) {
        float* xr = x + r * x_stride;
        if (residual != nullptr)
          at::vec::map2([](Vec p, Vec q) { return p + q; }, xr, xr, residual + r * n, n);
        rms_row(out + r * n, xr, weight, n, eps);
      }
    });
  } catch (...) {
    return 2;
  }
  return 0;
}

// qkv [rows, (heads + 2 * kv_heads) * d] (rows row_stride apart): q heads then k heads, each
// normed (when q_weight and k_weight are given) and rotated in place; v is not touched.
// cos, sin [rows, d] dense.
extern "C" int embedserve_qk_norm_rope_f32(float* qkv, int64_t row_stride, int64_t rows, int64_t heads,
                                           int64_t kv_heads, int64_t d, const float* q_weight,
                                           const float* k_weight, const float* cos, const float* sin,
                                           float eps) {
  if (rows < 0 || heads < 1 || kv_heads < 1 || d < 2 || d % 2 != 0 || row_stride < (heads + 2 * kv_heads) * d ||
      (q_weight == nullptr) != (k_weight == nullptr))
    return 1;
  try {
    at::parallel_for(0, rows, GRAIN, [&](int64_t a, int64_t b) {
      for (int64_t r = a; r < b; ++r) {
        float* row = qkv + r * row_stride;
        for (int64_t h = 0; h < heads + kv_heads; ++h) {
          float* x = row + h * d;
          if (q_weight != nullptr) rms_row(x, x, h < heads ? q_weight : k_weight, d, eps);
          rope_row(x, cos + r * d, sin + r * d, d);
        }
      }
    });
  } catch (...) {
    return 2;
  }
  return 0;
}
