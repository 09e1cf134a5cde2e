// A short step's decoder layers in one native call: every layer of a step whose sequences are
// all whole (no cached prefix) and few rows, without Python or the PyTorch dispatcher between
// the ~25 operations of each layer (docs/performance.md, 'Short steps in one native call').
//
// At 16 rows the projections are a read of the weights; what else a layer does (norms, RoPE,
// attention over 16 keys, the K/V store, the residual adds) is microseconds of arithmetic, but
// as PyTorch operations called from Python it cost a large part of a 0.6B query
// (docs/performance.md, 'Short steps in one native call', "What was left"). Here each
// layer is the same kernels the Python path calls, called back to back:
//
//   h = rms_norm(x += down)          (norm_rope.cpp; the first layer has no residual yet)
//   qkv = h Wqkv^T (+ bias)          (short_linear*.cpp over the packed weight)
//   q, k = rope(q/k norm(q, k))      (norm_rope.cpp, in place)
//   cache[slot] = k, v               (the paged K/V cache, every row that has a slot)
//   a = causal attention per sequence and head over its own rows (here)
//   h = rms_norm(x += a Wo^T)
//   down = (silu(h G^T) * h U^T) Wdown^T
//
// and after the last one x += down. Everything but the attention is the Python path's own
// kernels in its order, so the bits are its bits; the attention here sums in float32 and
// rounds once, where SDPA rounds its probabilities to bfloat16 before their product with V.
// The projection and norm kernels are reached through the function pointers the caller
// passes (kernels/short_forward.py), from their own libraries. Built by native.py.

#include "cpu_vec.h"  // first: sets the ISA ATen's vec headers compile for
#include "vec_math.h"  // rows to and from float32

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
using BF16 = at::BFloat16;

using LinearFn = int (*)(const void* x, int64_t m, int64_t k, int64_t ldx, const void* w, const void* bias,
                         int64_t n, void* y, int64_t ldy);
using GatedFn = int (*)(const void* x, int64_t m, int64_t k, int64_t ldx, const void* gate, const void* up,
                        int64_t n, void* y, int64_t ldy);
using NormFn = int (*)(void* x, int64_t x_stride, const void* residual, void* out, const void* weight,
                       int64_t rows, int64_t n, float eps);
using QkFn = int (*)(void* qkv, int64_t row_stride, int64_t rows, int64_t heads, int64_t kv_heads, int64_t d,
                     const void* q_weight, const void* k_weight, const void* cos, const void* sin, float eps);

// One layer's weights, all of the step's dtype: norms and bias plain, projections packed
// (the short-rows kernels' layouts); q_norm / k_norm and qkv_bias may be null.
struct Layer {
  const void* in_norm;
  const void* qkv;
  const void* qkv_bias;
  const void* q_norm;
  const void* k_norm;
  const void* o;
  const void* post_norm;
  const void* gate;
  const void* up;
  const void* down;
};

// The model's shapes and the kernels' entry points (ctypes mirror: kernels/short_forward.py).
struct Model {
  int64_t layers, hidden, heads, kv_heads, head_dim, intermediate;
  float eps, scale;
  LinearFn linear;
  GatedFn gate_up;
  NormFn add_norm;
  QkFn qk;
  const Layer* layer;
};

inline float widen1(float v) { return v; }
inline float widen1(BF16 v) { return static_cast<float>(v); }

float dot(const float* a, const float* b, int64_t n) {
  Vec acc(0.f);
  int64_t c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) acc = at::vec::fmadd(Vec::loadu(a + c), Vec::loadu(b + c), acc);
  float s = at::vec::vec_reduce_all<float>([](Vec x, Vec y) { return x + y; }, acc);
  for (; c < n; ++c) s += a[c] * b[c];
  return s;
}

// acc += p * v over n floats.
void axpy(float* acc, float p, const float* v, int64_t n) {
  int64_t c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) {
    at::vec::fmadd(Vec(p), Vec::loadu(v + c), Vec::loadu(acc + c)).store(acc + c);
  }
  for (; c < n; ++c) acc[c] += p * v[c];
}

// Causal attention of each sequence over its own rows (seqs: [q_start, q_len] pairs), from the
// roped q|k|v rows (qkv, `ld` apart) into out [rows, heads * d]. One task per (sequence, head):
// the KV head's keys and values widened once, then per query a float32 softmax over its keys
// 0 .. i and the float32 sum of their values, rounded once.
template <typename T>
void attend(const Model& m, const T* qkv, int64_t ld, const int64_t* seqs, int64_t nseq, T* out) {
  const int64_t d = m.head_dim, heads = m.heads, group = m.heads / m.kv_heads;
  const int64_t k_off = heads * d, v_off = (heads + m.kv_heads) * d;
  at::parallel_for(0, nseq * heads, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> keys, values, q(d), acc(d), p;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t q0 = seqs[2 * (t / heads)], n = seqs[2 * (t / heads) + 1], h = t % heads, kvh = h / group;
      keys.resize(n * d);
      values.resize(n * d);
      p.resize(n);
      for (int64_t j = 0; j < n; ++j) {
        embedserve::convert_row(qkv + (q0 + j) * ld + k_off + kvh * d, keys.data() + j * d, d);
        embedserve::convert_row(qkv + (q0 + j) * ld + v_off + kvh * d, values.data() + j * d, d);
      }
      for (int64_t i = 0; i < n; ++i) {
        embedserve::convert_row(qkv + (q0 + i) * ld + h * d, q.data(), d);
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = dot(q.data(), keys.data() + j * d, d) * m.scale;
          top = std::max(top, p[j]);
        }
        float total = 0.f;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - top);
          total += p[j];
          axpy(acc.data(), p[j], values.data() + j * d, d);
        }
        const float inv = 1.f / total;
        for (int64_t c = 0; c < d; ++c) acc[c] *= inv;
        embedserve::convert_row(acc.data(), out + (q0 + i) * heads * d + h * d, d);
      }
    }
  });
}

// Each row's k and v (after RoPE) into its cache slot: cache [2, slots, kv_heads, d].
template <typename T>
void store_kv(const Model& m, const T* qkv, int64_t ld, int64_t rows, const int64_t* slot, T* cache,
              int64_t slots) {
  const int64_t width = m.kv_heads * m.head_dim, k_off = m.heads * m.head_dim;
  for (int64_t r = 0; r < rows; ++r) {
    if (slot[r] < 0) continue;
    std::memcpy(cache + slot[r] * width, qkv + r * ld + k_off, width * sizeof(T));
    std::memcpy(cache + (slots + slot[r]) * width, qkv + r * ld + k_off + width, width * sizeof(T));
  }
}

// x += y, rounded to T (PyTorch's add in T).
template <typename T>
void add(T* x, const T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<T>(widen1(x[i]) + widen1(y[i]));
}

template <typename T>
int forward(const Model& m, T* x, int64_t rows, const T* cos, const T* sin, const int64_t* seqs, int64_t nseq,
            const int64_t* slot, void* const* caches, int64_t slots) {
  const int64_t hidden = m.hidden, width = (m.heads + 2 * m.kv_heads) * m.head_dim;
  const int64_t attn = m.heads * m.head_dim, inter = m.intermediate;
  thread_local std::vector<T> scratch;  // the step's activations, kept between calls
  scratch.resize(rows * (3 * hidden + width + attn + inter));
  T* h = scratch.data();  // a norm's output
  T* qkv = h + rows * hidden;
  T* a = qkv + rows * width;  // attention's output
  T* o = a + rows * attn;     // the output projection's
  T* g = o + rows * hidden;   // the gated MLP's
  T* down = g + rows * inter;
  int rc = 0;
  for (int64_t l = 0; l < m.layers && rc == 0; ++l) {
    const Layer& w = m.layer[l];
    rc = rc ? rc : m.add_norm(x, hidden, l == 0 ? nullptr : down, h, w.in_norm, rows, hidden, m.eps);
    rc = rc ? rc : m.linear(h, rows, hidden, hidden, w.qkv, w.qkv_bias, width, qkv, width);
    rc = rc ? rc : m.qk(qkv, width, rows, m.heads, m.kv_heads, m.head_dim, w.q_norm, w.k_norm, cos, sin, m.eps);
    if (rc != 0) break;
    if (slot != nullptr && caches != nullptr) store_kv<T>(m, qkv, width, rows, slot, static_cast<T*>(caches[l]), slots);
    attend<T>(m, qkv, width, seqs, nseq, a);
    rc = m.linear(a, rows, attn, attn, w.o, nullptr, hidden, o, hidden);
    rc = rc ? rc : m.add_norm(x, hidden, o, h, w.post_norm, rows, hidden, m.eps);
    rc = rc ? rc : m.gate_up(h, rows, hidden, hidden, w.gate, w.up, inter, g, inter);
    rc = rc ? rc : m.linear(g, rows, inter, inter, w.down, nullptr, hidden, down, hidden);
  }
  if (rc == 0 && m.layers > 0) add<T>(x, down, rows * hidden);
  return rc;
}

// 0: done; 3: shapes refused; else the failing kernel's code (nothing is thrown into ctypes).
template <typename T>
int entry(const Model* m, T* x, int64_t rows, const T* cos, const T* sin, const int64_t* seqs, int64_t nseq,
          const int64_t* slot, void* const* caches, int64_t slots) {
  int64_t covered = 0;
  for (int64_t s = 0; s < nseq; ++s) {
    if (seqs[2 * s] != covered || seqs[2 * s + 1] < 1) return 3;
    covered += seqs[2 * s + 1];
  }
  if (m == nullptr || covered != rows || m->heads % m->kv_heads != 0 || m->head_dim % 2 != 0) return 3;
  try {
    return forward<T>(*m, x, rows, cos, sin, seqs, nseq, slot, caches, slots);
  } catch (...) {
    return 4;
  }
}

}  // namespace

// x [rows, hidden] dense, updated in place through every layer of `m`; cos, sin [rows, d];
// seqs [nseq][q_start, q_len], back to back from row 0; slot [rows] (-1: none) and caches
// [layers] of [2, slots, kv_heads, d], or both null (no cache).
extern "C" int embedserve_short_forward_f32(const Model* m, float* x, int64_t rows, const float* cos,
                                            const float* sin, const int64_t* seqs, int64_t nseq,
                                            const int64_t* slot, void* const* caches, int64_t slots) {
  return entry<float>(m, x, rows, cos, sin, seqs, nseq, slot, caches, slots);
}

extern "C" int embedserve_short_forward_bf16(const Model* m, BF16* x, int64_t rows, const BF16* cos,
                                             const BF16* sin, const int64_t* seqs, int64_t nseq,
                                             const int64_t* slot, void* const* caches, int64_t slots) {
  return entry<BF16>(m, x, rows, cos, sin, seqs, nseq, slot, caches, slots);
}
