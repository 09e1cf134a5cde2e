// The float steps after an int8 matmul's sums, shared by int8_rows.cpp (`finish_rows`, after
// oneDNN) and int8_short.cpp (after its own sums): one definition, so a row gets the same
// bytes on either path. Per column i of a row segment, with explicit fused steps (the compiler
// contracts a * b + c on its own where it likes, so nothing here is left to it):
//
//   v = fma(-(z s), fix[i], sums[i] * s) + bias[i];   v = fma(xo[j], w_out[j, i], v) for each j
#pragma once

#include "cpu_vec.h"

#include <cmath>
#include <cstdint>

namespace embedserve_int8 {

// y [cols]: the row's sums in, its outputs out; fix, bias, w_out start at the segment's first
// column; w_out's rows are `ldw` floats apart.
inline void finish_segment(float* y, int64_t cols, float s, float zs, const float* fix, const float* bias,
                           const float* xo, int64_t n_out, const float* w_out, int64_t ldw) {
  using Vec = at::vec::Vectorized<float>;
  constexpr int64_t W = Vec::size();
  const int64_t whole = cols / W * W;
  const Vec vs(s), vnzs(-zs);
  for (int64_t i = 0; i < whole; i += W) {
    Vec v = at::vec::fmadd(vnzs, Vec::loadu(fix + i), Vec::loadu(y + i) * vs) + Vec::loadu(bias + i);
    for (int64_t j = 0; j < n_out; ++j) v = at::vec::fmadd(Vec(xo[j]), Vec::loadu(w_out + j * ldw + i), v);
    v.store(y + i);
  }
  for (int64_t i = whole; i < cols; ++i) {
    float v = std::fma(-zs, fix[i], y[i] * s) + bias[i];
    for (int64_t j = 0; j < n_out; ++j) v = std::fma(xo[j], w_out[j * ldw + i], v);
    y[i] = v;
  }
}

}  // namespace embedserve_int8
