// Row helpers of the kernels: rows to and from float32, and the softmax's exp and sum, max,
// rows scaled (and rounded to bfloat16). Where the build targets AVX-512 (EMBEDSERVE_AVX512)
// the softmax's use the helpers below; elsewhere ATen's vector code.
//
// ATen's Vectorized<float>::exp_u20 is a degree-5 polynomial with range checks (about 20
// instructions, up to 20 ulp), and its bfloat16 rounding emulates round-to-nearest-even in
// integer ops (about 12 instructions per 32 floats) even where the CPU has AVX512_BF16's
// one-instruction conversion. The flash kernel's softmax runs both once per score: these
// speed up its bf16 attention, most at short prompts (docs/performance.md, "Flash kernel
// round").
#pragma once

#include "cpu_vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#ifdef CPU_CAPABILITY_AVX512  // cpu_vec.h's test: ATen's 512-bit Vec is there too
#define EMBEDSERVE_AVX512 1
#include <immintrin.h>
#endif

namespace embedserve {

using BF16 = at::BFloat16;
using Vec = at::vec::Vectorized<float>;

// n values of a row into dst, converted (bfloat16 to and from float32) or copied: nothing to
// do when dst is src. src and dst are the same row or do not overlap.
template <typename In, typename Out>
inline void convert_row(const In* src, Out* dst, int64_t n) {
  if constexpr (std::is_same_v<In, Out>) {
    if (src != dst) std::copy(src, src + n, dst);
  } else {
    at::vec::convert(src, dst, n);
  }
}

#ifdef EMBEDSERVE_AVX512
// exp(x) of 16 floats: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by its degree-6 Taylor
// polynomial (relative error below 2e-7: about 2 ulp), times 2^n by scalef, which
// underflows to zero, overflows to inf and keeps NaN. Inputs below -104 (exp is 0 in float
// there) are clamped first: -inf or a huge negative x would make r NaN or the polynomial inf.
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.f), x);  // x second: a NaN x passes through
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2's high bits: n * hi is exact
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);    // and the rest of ln2
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// 16 floats rounded to bfloat16, to nearest even (AVX512_BF16's conversion where the CPU has
// it: it also flushes denormals, below 1.2e-38, to zero; else ATen's emulation).
inline __m256i to_bf16(__m512 x) {
#if defined(__AVX512BF16__)
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
#else
  const Vec v(x);
  return _mm512_castsi512_si256(at::vec::convert_from_float<BF16>(v, v));
#endif
}

// 16 bfloat16 at src widened to float (exact: a 16-bit shift).
inline __m512 from_bf16(const BF16* src) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}

inline __m512 load16(const float* src) { return _mm512_loadu_ps(src); }
inline __m512 load16(const BF16* src) { return from_bf16(src); }
inline void store16(float* dst, __m512 x) { _mm512_storeu_ps(dst, x); }
inline void store16(BF16* dst, __m512 x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), to_bf16(x)); }

// The lanes of a 16-float vector starting at j that lie before `end`.
inline __mmask16 lanes_before(int64_t j, int64_t end) {
  const int64_t left = end - j;
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
}
#endif

// exp(s - top) over the first `valid` of `len` floats, zero after them, into p (float: may
// be s itself; bfloat16: rounded); returns the sum of the unrounded exps. len is a
// multiple of 16 (whole vectors).
template <typename P>
float exp_and_sum(const float* s, P* p, int64_t valid, int64_t len, float top) {
  int64_t j = 0;
#ifdef EMBEDSERVE_AVX512
  const __m512 vtop = _mm512_set1_ps(top);
  __m512 acc = _mm512_setzero_ps();
  for (; j < valid; j += 16) {  // the last vector's lanes past `valid` are zeros
    const __mmask16 m = lanes_before(j, valid);
    const __m512 e = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), vtop)));
    acc = _mm512_add_ps(acc, e);
    store16(p + j, e);
  }
  const float sum = _mm512_reduce_add_ps(acc);
#else
  Vec acc(0.f);
  for (; j + Vec::size() <= valid; j += Vec::size()) {
    const Vec e = (Vec::loadu(s + j) - Vec(top)).exp_u20();
    if constexpr (std::is_same_v<P, float>) {
      e.store(p + j);
    } else {
      at::vec::convert_from_float<P>(e, e).store(p + j, Vec::size());
    }
    acc = acc + e;
  }
  float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, acc);
  for (; j < valid; ++j) {
    const float e = std::exp(s[j] - top);
    p[j] = P(e);
    sum += e;
  }
#endif
  std::fill(p + j, p + len, P(0.f));
  return sum;
}

// The largest of the first `valid` floats (a NaN score gives a NaN output either way: its
// exp is NaN).
inline float row_max(const float* s, int64_t valid) {
  return at::vec::reduce_all<float>([](Vec& a, Vec& b) { return at::vec::clamp_min(a, b); }, s, valid);
}

// dst = alpha * src over d values (dst may be src), each rounded to Out: float -> float,
// bfloat16 -> bfloat16 (queries scaled), float -> bfloat16 (outputs normalized).
template <typename Out, typename In>
void scale_row(Out* dst, const In* src, int64_t d, float alpha) {
  int64_t c = 0;
#ifdef EMBEDSERVE_AVX512
  for (; c + 16 <= d; c += 16) store16(dst + c, _mm512_mul_ps(load16(src + c), _mm512_set1_ps(alpha)));
#endif
  for (; c < d; ++c) dst[c] = Out(static_cast<float>(src[c]) * alpha);
}

}  // namespace embedserve
