// The per-token steps around oneDNN's int8 matmul (models/int8_linear.py), each one pass over
// its rows instead of a chain of PyTorch ops (index_fill, aminmax, div, add, round, clamp, to;
// gather, addmm, addcmul, addr), every one a pass into a fresh tensor:
//
//   quantize_rows: per row t of x [rows, K], the inlier channels (mask[k] == 0) mapped onto
//                  0..127: s_t = (max(hi, 0) - min(lo, 0)) / 127, z_t = round(-(lo / s_t)),
//                  q = clamp(round(x / s_t + z_t), 0, 127); the outlier channels' values copied
//                  out to xo [rows, k] (and quantized as 0: their int8 weight columns are zero).
//   finish_rows:   y = sums * s_t - (z_t * s_t) * fix[n] + bias[n] + xo[t] . w_out[:, n],
//                  in place on oneDNN's output sums [rows, N], in int8_finish.h's steps (shared
//                  with int8_short.cpp, whose rows then get these bytes).
//
// Rounding is to nearest even (std::nearbyint), as torch.round; divisions are divisions, so a
// row quantizes to the same bytes as the PyTorch ops give. Built by embedserve/kernels/native.py.

#include "cpu_vec.h"  // first: sets the ISA ATen's vec headers compile for
#include "int8_finish.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t GRAIN = 16;
constexpr float LEVELS = 127.0f;
constexpr int64_t W = Vec::size();

void quantize_rows(const float* x, int64_t rows, int64_t k_in, const uint8_t* mask, const int64_t* outliers,
                   int64_t n_out, uint8_t* q, float* scale, float* zero, float* xo) {
  // keep[k]: 1 for an inlier channel, 0 for an outlier (x * keep: the row with outliers as 0)
  std::vector<float> keep(k_in);
  for (int64_t k = 0; k < k_in; ++k) keep[k] = mask[k] ? 0.0f : 1.0f;
  const int64_t whole = k_in / W * W;
  at::parallel_for(0, rows, GRAIN, [&](int64_t a, int64_t b) {
    std::vector<float> level(k_in);
    for (int64_t t = a; t < b; ++t) {
      const float* row = x + t * k_in;
      Vec vlo(0.0f), vhi(0.0f);
      for (int64_t k = 0; k < whole; k += W) {
        const Vec v = Vec::loadu(row + k) * Vec::loadu(keep.data() + k);
        vlo = at::vec::minimum(vlo, v);
        vhi = at::vec::maximum(vhi, v);
      }
      float lo = 0.0f, hi = 0.0f, lanes[W];
      vlo.store(lanes);
      for (int64_t i = 0; i < W; ++i) lo = std::min(lo, lanes[i]);
      vhi.store(lanes);
      for (int64_t i = 0; i < W; ++i) hi = std::max(hi, lanes[i]);
      for (int64_t k = whole; k < k_in; ++k) {
        lo = std::min(lo, row[k] * keep[k]);
        hi = std::max(hi, row[k] * keep[k]);
      }
      const float s = std::max((hi - lo) / LEVELS, 1e-30f);
      const float z = std::nearbyint(-(lo / s));
      const Vec vs(s), vz(z), top(LEVELS), bottom(0.0f);
      for (int64_t k = 0; k < whole; k += W) {
        const Vec v = Vec::loadu(row + k) * Vec::loadu(keep.data() + k);
        at::vec::clamp((v / vs + vz).round(), bottom, top).store(level.data() + k);
      }
      for (int64_t k = whole; k < k_in; ++k) {
        level[k] = std::min(std::max(std::nearbyint(row[k] * keep[k] / s + z), 0.0f), LEVELS);
      }
      uint8_t* out = q + t * k_in;
      for (int64_t k = 0; k < k_in; ++k) out[k] = static_cast<uint8_t>(static_cast<int32_t>(level[k]));
      for (int64_t j = 0; j < n_out; ++j) xo[t * n_out + j] = row[outliers[j]];
      scale[t] = s;
      zero[t] = z;
    }
  });
}

void finish_rows(float* y, int64_t rows, int64_t n, const float* scale, const float* zero, const float* fix,
                 const float* bias, const float* xo, int64_t n_out, const float* w_out) {
  at::parallel_for(0, rows, GRAIN, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t) {
      embedserve_int8::finish_segment(y + t * n, n, scale[t], zero[t] * scale[t], fix, bias, xo + t * n_out, n_out,
                                      w_out, n);
    }
  });
}

}  // namespace

extern "C" int embedserve_int8_quantize_rows(const float* x, int64_t rows, int64_t k_in, const uint8_t* mask,
                                             const int64_t* outliers, int64_t n_out, uint8_t* q, float* scale,
                                             float* zero, float* xo) {
  try {
    quantize_rows(x, rows, k_in, mask, outliers, n_out, q, scale, zero, xo);
    return 0;
  } catch (...) {
    return 1;
  }
}

extern "C" int embedserve_int8_finish_rows(float* y, int64_t rows, int64_t n, const float* scale,
                                           const float* zero, const float* fix, const float* bias,
                                           const float* xo, int64_t n_out, const float* w_out) {
  try {
    finish_rows(y, rows, n, scale, zero, fix, bias, xo, n_out, w_out);
    return 0;
  } catch (...) {
    return 1;
  }
}
