// RMSNorm, the residual add before it, and Qwen3's per-head q/k norm with rotary embedding
// on the CPU, in float32 and bfloat16, each one pass over its rows.
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
// The arithmetic is Hugging Face's in float32 (the order of the sum of squares aside: about
// one rounding). bfloat16 rows are widened to float32 and rounded back to bfloat16 where the
// PyTorch ops in bfloat16 round: after the residual add, the normalized row before the weight,
// the weight's product, and each product and the sum of RoPE. Built by
// embedserve/kernels/native.py.

#include "cpu_vec.h"  // first: sets the ISA ATen's vec headers compile for
#include "vec_math.h"  // rows to and from float32

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
using BF16 = at::BFloat16;

constexpr int64_t GRAIN = 4;  // rows per task at least: a 16-token query's rows on both threads

// x rounded to the element type's precision: bfloat16 rounds (to nearest even, as PyTorch's
// ops do when they store a bfloat16 result), float32 is x.
template <typename T>
Vec rnd(Vec x) {
  if constexpr (std::is_same_v<T, BF16>) {
    return std::get<0>(at::vec::convert_to_float<BF16>(at::vec::convert_from_float<BF16>(x, x)));
  } else {
    return x;
  }
}

template <typename T>
float rnd(float x) {
  return static_cast<float>(static_cast<T>(x));
}

// dst = rnd(w * rnd(src * rsqrt(mean(src^2) + eps))) over n floats (dst may be src).
template <typename T>
void rms_row(float* dst, const float* src, const float* w, int64_t n, float eps) {
  const float squares = at::vec::map_reduce_all<float>(
      [](Vec x) { return x * x; }, [](Vec a, Vec b) { return a + b; }, src, n);
  const float inv = 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
  at::vec::map2([inv](Vec x, Vec wv) { return rnd<T>(wv * rnd<T>(x * Vec(inv))); }, dst, src, w, n);
}

// x = x * cos + rotate_half(x) * sin over one head of d floats, in place, each product and
// the sum rounded to T; cos and sin are the row's [d] tables (their halves are equal, as
// rotary tables are built).
template <typename T>
void rope_row(float* x, const float* cos, const float* sin, int64_t d) {
  const int64_t half = d / 2;
  int64_t c = 0;
  for (; c + Vec::size() <= half; c += Vec::size()) {
    const Vec x1 = Vec::loadu(x + c), x2 = Vec::loadu(x + half + c);
    rnd<T>(rnd<T>(x1 * Vec::loadu(cos + c)) - rnd<T>(x2 * Vec::loadu(sin + c))).store(x + c);
    rnd<T>(rnd<T>(x2 * Vec::loadu(cos + half + c)) + rnd<T>(x1 * Vec::loadu(sin + half + c))).store(x + half + c);
  }
  for (; c < half; ++c) {
    const float x1 = x[c], x2 = x[half + c];
    x[c] = rnd<T>(rnd<T>(x1 * cos[c]) - rnd<T>(x2 * sin[c]));
    x[half + c] = rnd<T>(rnd<T>(x2 * cos[half + c]) + rnd<T>(x1 * sin[half + c]));
  }
}

// A row of T as float32: float rows are read in place, bfloat16 rows are widened into buf.
// (Back into the row: embedserve::convert_row, a no-op for a row read in place.)
const float* widen(const float* src, float*, int64_t) { return src; }
const float* widen(const BF16* src, float* buf, int64_t n) {
  embedserve::convert_row(src, buf, n);
  return buf;
}
float* widen(float* src, float*, int64_t) { return src; }
float* widen(BF16* src, float* buf, int64_t n) {
  embedserve::convert_row(src, buf, n);
  return buf;
}

template <typename T>
void add_rms_norm(T* x, int64_t x_stride, const T* residual, T* out, const T* weight, int64_t rows, int64_t n,
                  float eps) {
  at::parallel_for(0, rows, GRAIN, [&](int64_t a, int64_t b) {
    const int64_t m = std::is_same_v<T, float> ? 0 : n;  // float rows are read in place
    std::vector<float> xb(m), rb(m), wb(m), ob(m);        // bfloat16 rows widened
    const float* w = widen(weight, wb.data(), n);
    for (int64_t r = a; r < b; ++r) {
      T* xr = x + r * x_stride;
      float* xf = widen(xr, xb.data(), n);
      if (residual != nullptr) {
        const float* rf = widen(residual + r * n, rb.data(), n);
        at::vec::map2([](Vec p, Vec q) { return rnd<T>(p + q); }, xf, xf, rf, n);
        embedserve::convert_row(xf, xr, n);
      }
      T* o = out + r * n;
      float* of = ob.data();
      if constexpr (std::is_same_v<T, float>) of = o;
      rms_row<T>(of, xf, w, n, eps);
      embedserve::convert_row(of, o, n);
    }
  });
}

template <typename T>
void qk_norm_rope(T* qkv, int64_t row_stride, int64_t rows, int64_t heads, int64_t kv_heads, int64_t d,
                  const T* q_weight, const T* k_weight, const T* cos, const T* sin, float eps) {
  at::parallel_for(0, rows, GRAIN, [&](int64_t a, int64_t b) {
    const int64_t m = std::is_same_v<T, float> ? 0 : d;  // float rows are read in place
    std::vector<float> hb(m), cb(m), sb(m), qb(m), kb(m);  // bfloat16 rows widened
    const float* qw = q_weight != nullptr ? widen(q_weight, qb.data(), d) : nullptr;
    const float* kw = k_weight != nullptr ? widen(k_weight, kb.data(), d) : nullptr;
    for (int64_t r = a; r < b; ++r) {
      T* row = qkv + r * row_stride;
      const float* c = widen(cos + r * d, cb.data(), d);
      const float* s = widen(sin + r * d, sb.data(), d);
      for (int64_t h = 0; h < heads + kv_heads; ++h) {
        float* x = widen(row + h * d, hb.data(), d);
        if (qw != nullptr) rms_row<T>(x, x, h < heads ? qw : kw, d, eps);
        rope_row<T>(x, c, s, d);
        embedserve::convert_row(x, row + h * d, d);
      }
    }
  });
}

// The entry points' shared body: 1 when the shapes are refused, else f's outcome (0: done;
// 2: an exception, which must not unwind into ctypes).
template <typename F>
int checked(bool ok, F&& f) {
  if (!ok) return 1;
  try {
    f();
  } catch (...) {
    return 2;
  }
  return 0;
}

template <typename T>
int add_rms_norm_entry(T* x, int64_t x_stride, const T* residual, T* out, const T* weight, int64_t rows,
                       int64_t n, float eps) {
  return checked(rows >= 0 && n >= 1 && x_stride >= n,
                 [&] { add_rms_norm<T>(x, x_stride, residual, out, weight, rows, n, eps); });
}

template <typename T>
int qk_norm_rope_entry(T* qkv, int64_t row_stride, int64_t rows, int64_t heads, int64_t kv_heads, int64_t d,
                       const T* q_weight, const T* k_weight, const T* cos, const T* sin, float eps) {
  const bool ok = rows >= 0 && heads >= 1 && kv_heads >= 1 && d >= 2 && d % 2 == 0 &&
                  row_stride >= (heads + 2 * kv_heads) * d && (q_weight == nullptr) == (k_weight == nullptr);
  return checked(ok, [&] {
    qk_norm_rope<T>(qkv, row_stride, rows, heads, kv_heads, d, q_weight, k_weight, cos, sin, eps);
  });
}

}  // namespace

// x [rows, n] (rows x_stride apart), residual [rows, n] dense or null, out [rows, n] dense.
// 0: done; 1: shapes refused; 2: an exception.
extern "C" int embedserve_add_rms_norm_f32(float* x, int64_t x_stride, const float* residual, float* out,
                                           const float* weight, int64_t rows, int64_t n, float eps) {
  return add_rms_norm_entry<float>(x, x_stride, residual, out, weight, rows, n, eps);
}

extern "C" int embedserve_add_rms_norm_bf16(BF16* x, int64_t x_stride, const BF16* residual, BF16* out,
                                            const BF16* weight, int64_t rows, int64_t n, float eps) {
  return add_rms_norm_entry<BF16>(x, x_stride, residual, out, weight, rows, n, eps);
}

// qkv [rows, (heads + 2 * kv_heads) * d] (rows row_stride apart): q heads then k heads, each
// normed (when q_weight and k_weight are given) and rotated in place; v is not touched.
// cos, sin [rows, d] dense. Returns as above.
extern "C" int embedserve_qk_norm_rope_f32(float* qkv, int64_t row_stride, int64_t rows, int64_t heads,
                                           int64_t kv_heads, int64_t d, const float* q_weight,
                                           const float* k_weight, const float* cos, const float* sin,
                                           float eps) {
  return qk_norm_rope_entry<float>(qkv, row_stride, rows, heads, kv_heads, d, q_weight, k_weight, cos, sin, eps);
}

extern "C" int embedserve_qk_norm_rope_bf16(BF16* qkv, int64_t row_stride, int64_t rows, int64_t heads,
                                            int64_t kv_heads, int64_t d, const BF16* q_weight,
                                            const BF16* k_weight, const BF16* cos, const BF16* sin,
                                            float eps) {
  return qk_norm_rope_entry<BF16>(qkv, row_stride, rows, heads, kv_heads, d, q_weight, k_weight, cos, sin, eps);
}
