// Helpers shared by the fused CPU kernels: masked vector loads and stores on ATen's
// `Vectorized`, sigmoid and a fast fp32 tanh, and the register-blocked GEMM. Every op file
// includes this header; build.py compiles the op files into one extension.
//
// Floating types are float and double; every sum runs in the input type (fp32 for the model).
// Every kernel runs on the calling thread: the studies give each trial one thread, and threading
// here would need a second OpenMP runtime beside the one torch bundles.

#pragma once

// ATen's tensor and only the operators the kernels call: the full ATen.h header would triple
// each op file's compile time.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

template <typename T>
using Vec = at::vec::Vectorized<T>;

// Loads and stores of the first `count` lanes (masked moves; the other lanes read as zero).
#if defined(CPU_CAPABILITY_AVX512)
inline Vec<float> load(const float* p, int64_t count) {
  return count == 16 ? Vec<float>(_mm512_loadu_ps(p))
                     : Vec<float>(_mm512_maskz_loadu_ps(__mmask16((1u << count) - 1), p));
}
inline Vec<double> load(const double* p, int64_t count) {
  return count == 8 ? Vec<double>(_mm512_loadu_pd(p))
                    : Vec<double>(_mm512_maskz_loadu_pd(__mmask8((1u << count) - 1), p));
}
inline void store(const Vec<float>& v, float* p, int64_t count) {
  _mm512_mask_storeu_ps(p, __mmask16((1u << count) - 1), v);
}
inline void store(const Vec<double>& v, double* p, int64_t count) {
  _mm512_mask_storeu_pd(p, __mmask8((1u << count) - 1), v);
}
#else
inline __m256i lane_mask(int64_t count, int64_t lane_bytes) {
  alignas(32) static const int32_t table[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                0,  0,  0,  0,  0,  0,  0,  0};
  // 64-bit lanes are two 32-bit halves of the same mask.
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(table + 8 - count * (lane_bytes / 4)));
}
inline Vec<float> load(const float* p, int64_t count) {
  return count == 8 ? Vec<float>(_mm256_loadu_ps(p))
                    : Vec<float>(_mm256_maskload_ps(p, lane_mask(count, 4)));
}
inline Vec<double> load(const double* p, int64_t count) {
  return count == 4 ? Vec<double>(_mm256_loadu_pd(p))
                    : Vec<double>(_mm256_maskload_pd(p, lane_mask(count, 8)));
}
inline void store(const Vec<float>& v, float* p, int64_t count) {
  if (count == 8) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, lane_mask(count, 4), v);
  }
}
inline void store(const Vec<double>& v, double* p, int64_t count) {
  if (count == 4) {
    _mm256_storeu_pd(p, v);
  } else {
    _mm256_maskstore_pd(p, lane_mask(count, 8), v);
  }
}
#endif

// Horizontal sum and max of one vector, halving the lanes pairwise. ATen's `vec_reduce_all` is
// not used: under AVX-512 (torch 2.13) it has no overload for a plain `Vectorized<T>`, and the
// kernels must build at every capability torch reports (tests/ops/test_kernel_build.py).
template <typename T, typename Op>
T reduce_lanes(const Vec<T>& x, const Op& op) {
  constexpr int64_t L = Vec<T>::size();
  alignas(64) T lanes[L];
  x.store(lanes);
  for (int64_t half = L / 2; half > 0; half /= 2) {
    for (int64_t i = 0; i < half; ++i) lanes[i] = op(lanes[i], lanes[i + half]);
  }
  return lanes[0];
}

template <typename T>
T reduce_sum(const Vec<T>& x) {
  return reduce_lanes(x, [](T a, T b) { return a + b; });
}

template <typename T>
T reduce_max(const Vec<T>& x) {
  // NaN wins, as in at::vec::maximum: a NaN score must not vanish from the row maximum.
  return reduce_lanes(x, [](T a, T b) { return std::isnan(a) || a >= b ? a : b; });
}

// exp(-x) overflows to inf for very negative x, and 1 / (1 + inf) = 0: no NaN. The router's
// scores use Sleef's exp (they matched torch.sigmoid bitwise in the tests, so both paths select
// alike); activations use ATen's faster 20-ulp exp, under 1e-6 relative on the sigmoid.
template <typename T>
Vec<T> sigmoid_accurate(const Vec<T>& x) {
  const Vec<T> one(T(1));
  return one / (one + x.neg().exp());
}

template <typename T>
Vec<T> sigmoid(const Vec<T>& x) {
  const Vec<T> one(T(1));
  return one / (one + x.neg().exp_u20());
}

// tanh for fp32 from one exp: sign(x) (1 - e) / (1 + e), e = exp(-2|x|) <= 1 (no overflow); below
// |x| = 0.1, where 1 - e cancels, the odd Taylor series to x^7 (truncation < 1e-9 relative).
// Sleef's exp took a quarter of the time of its tanh here (0.6 vs 2.5 ns per fp32 element);
// this stays within 2e-6 relative of tanh (tests). fp64 keeps Sleef's tanh.
template <typename T>
Vec<T> tanh(const Vec<T>& x) {
  if constexpr (std::is_same_v<T, double>) {
    return x.tanh();
  } else {
    using V = Vec<T>;
    const V one(1.f), magnitude = x.abs();
    const V e = (magnitude * V(-2.f)).exp();
    const V far = (one - e) / (one + e);
    const V x2 = magnitude * magnitude;
    const V series = at::vec::fmadd(
        x2, at::vec::fmadd(x2, at::vec::fmadd(x2, V(-17.f / 315.f), V(2.f / 15.f)), V(-1.f / 3.f)),
        one);
    const V result = V::blendv(far, magnitude * series, magnitude < V(0.1f));
    return V::blendv(result, result.neg(), x < V(0.f));
  }
}

// C[r][p0:p0+count] (+)= sum_k A(r, k) B[k][p0:p0+count] for r in [r0, r0 + R): the R
// accumulators stay in registers while the loop over k streams B's rows (one load, R FMAs).
// A is an element accessor, B and C row accessors, so gathered token rows need no copies.
template <int64_t R, bool Accumulate, typename T, typename AFn, typename BFn, typename CFn>
void gemm_block(const AFn& a, const BFn& b_row, const CFn& c_row, int64_t r0, int64_t depth,
                int64_t p0, int64_t count) {
  using V = Vec<T>;
  V acc[R];
#pragma GCC unroll 4
  for (int64_t q = 0; q < R; ++q) acc[q] = Accumulate ? load(c_row(r0 + q) + p0, count) : V(T(0));
  for (int64_t k = 0; k < depth; ++k) {
    const V v = load(b_row(k) + p0, count);
#pragma GCC unroll 4
    for (int64_t q = 0; q < R; ++q) acc[q] = at::vec::fmadd(V(a(r0 + q, k)), v, acc[q]);
  }
#pragma GCC unroll 4
  for (int64_t q = 0; q < R; ++q) store(acc[q], c_row(r0 + q) + p0, count);
}

// C [rows, width] (+)= A [rows, depth] B [depth, width], through the accessors of gemm_block.
// Loop order: with RowsOuter a row block's A rows (gathered token rows) stay in L1 across the
// column vectors; without, one column vector of every B row (gathered token rows, when the
// depth runs over tokens, as in weight gradients) stays in L1 across the row blocks.
template <bool Accumulate, bool RowsOuter, typename T, typename AFn, typename BFn, typename CFn>
void gemm(const AFn& a, const BFn& b_row, const CFn& c_row, int64_t rows, int64_t depth,
          int64_t width) {
  constexpr int64_t L = Vec<T>::size();
  auto block = [&](int64_t r, int64_t p0) {
    const int64_t count = std::min<int64_t>(L, width - p0);
    if (r + 4 <= rows) {
      gemm_block<4, Accumulate, T>(a, b_row, c_row, r, depth, p0, count);
    } else {
      for (; r < rows; ++r) gemm_block<1, Accumulate, T>(a, b_row, c_row, r, depth, p0, count);
    }
  };
  if (RowsOuter) {
    for (int64_t r = 0; r < rows; r += 4) {
      for (int64_t p0 = 0; p0 < width; p0 += L) block(r, p0);
    }
  } else {
    for (int64_t p0 = 0; p0 < width; p0 += L) {
      for (int64_t r = 0; r < rows; r += 4) block(r, p0);
    }
  }
}
