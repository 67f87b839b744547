// Fused CPU kernels for the small layers of the study ladders (d 16-256), where eager torch spends
// its time on per-op overhead rather than arithmetic. Built on first use by `build.py`; the plain
// torch references sit next to their callers (ops/moe/naive.py and dispatch.py, ops/situ/naive.py)
// and the tests compare outputs and every gradient.
//
// * GLU activations h = act(g, u), forward and backward in one elementwise pass each:
//   SwiGLU (kind 0) and SiTU-GLU (kind 1, architecture.md section 6).
// * Routed experts (architecture.md section 5) on assignments sorted by expert (a counting sort,
//   plan_dispatch_op): per expert, tiles of up to kTile tokens are read in place (token rows by
//   index, no gather copies) and every projection is a small register-blocked GEMM; activation
//   and routing weight are applied in the same pass. Weight gradients reduce over an expert's
//   tokens in sorted order, so results are deterministic.
// * The router after its linear map (sigmoid, top-k with the balancing bias, weights), the
//   sequence-wise aux loss, and Quantile Balancing's margin counts.
// * The output head's cross-entropy on a chunk of logits, turned into its gradient in place.
// * KDA's short convolution and SiLU over time, in the projections' [B, T, P] layout.
// * Whole MoE layers, K2 and K3 (Stable LatentMoE), composed from the above, one call per
//   direction: eager Python between the pieces had cost about as much as their arithmetic at
//   d = 16-64.
//
// Floating types are float and double; every sum runs in the input type (fp32 for the model).
// Every kernel runs on the calling thread: the studies give each trial one thread, and threading
// here would need a second OpenMP runtime beside the one torch bundles.

#include <ATen/cpu/vec/vec.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kSwiglu = 0;
constexpr int64_t kSitu = 1;
// Tokens per expert tile: its [kTile, f] buffers stay in L1/L2 at the study widths.
constexpr int64_t kTile = 128;

struct Activation {
  int64_t kind;
  double beta;         // SiTU gate cap
  double linear_beta;  // SiTU up cap; <= 0 leaves the up branch uncapped
};

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

// h = act(g, u) on one vector.
template <typename T>
Vec<T> glu_value(const Activation& act, const Vec<T>& g, const Vec<T>& u) {
  using V = Vec<T>;
  const V sig = sigmoid(g);
  if (act.kind == kSwiglu) return g * sig * u;
  const V beta(T(act.beta)), linear_beta(T(act.linear_beta));
  const V situ = beta * tanh(g / beta) * sig;
  return situ * (act.linear_beta > 0 ? linear_beta * tanh(u / linear_beta) : u);
}

// h = act(g, u) and its partial derivatives dh/dg, dh/du on one vector.
template <typename T>
void glu_partials(const Activation& act, const Vec<T>& g, const Vec<T>& u, Vec<T>& h, Vec<T>& dh_dg,
                  Vec<T>& dh_du) {
  using V = Vec<T>;
  const V one(T(1)), sig = sigmoid(g);
  if (act.kind == kSwiglu) {
    const V silu = g * sig;
    h = silu * u;
    dh_dg = u * sig * (one + g * (one - sig));
    dh_du = silu;
    return;
  }
  const V beta(T(act.beta)), linear_beta(T(act.linear_beta));
  const V tg = tanh(g / beta);
  const V situ = beta * tg * sig;
  V capped = u, d_capped = one;
  if (act.linear_beta > 0) {
    const V tu = tanh(u / linear_beta);
    capped = linear_beta * tu;
    d_capped = one - tu * tu;
  }
  h = situ * capped;
  dh_dg = capped * ((one - tg * tg) * sig + situ * (one - sig));
  dh_du = situ * d_capped;
}

// h = act(g, u) on n contiguous elements (partial vectors at the tail, same math).
template <typename T>
void glu_forward(const Activation& act, const T* g, const T* u, T* h, int64_t n) {
  using V = Vec<T>;
  for (int64_t i = 0; i < n; i += V::size()) {
    const int64_t count = std::min<int64_t>(V::size(), n - i);
    store(glu_value(act, load(g + i, count), load(u + i, count)), h + i, count);
  }
}

// dg, du from dh for h = act(g, u) on n contiguous elements.
template <typename T>
void glu_backward(const Activation& act, const T* g, const T* u, const T* dh, T* dg, T* du,
                  int64_t n) {
  using V = Vec<T>;
  for (int64_t i = 0; i < n; i += V::size()) {
    const int64_t count = std::min<int64_t>(V::size(), n - i);
    V h, dh_dg, dh_du;
    glu_partials(act, load(g + i, count), load(u + i, count), h, dh_dg, dh_du);
    const V grad = load(dh + i, count);
    store(grad * dh_dg, dg + i, count);
    store(grad * dh_du, du + i, count);
  }
}

// Slots left at -1 (a row whose values never beat -inf: NaN or -inf throughout) take the lowest
// experts not yet in the row, so every index is valid and the row's experts are distinct.
inline void fill_unselected(int64_t* row, int64_t count) {
  int64_t next = 0;
  for (int64_t p = 0; p < count; ++p) {
    if (row[p] >= 0) continue;
    while (std::find(row, row + count, next) != row + count) ++next;
    row[p] = next++;
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

// dst [cols, rows] = src [rows, cols]^T.
template <typename T>
void transpose(const T* src, int64_t rows, int64_t cols, T* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  }
}

struct Plan {
  const int64_t* order;     // [Nk] flat assignment of each sorted slot
  const int64_t* token_of;  // [Nk] token of each sorted assignment
  const int64_t* offsets;   // [E + 1] start of each expert's sorted range
  int64_t num_experts;
  int64_t width;   // a: token width (d_model or d_latent)
  int64_t hidden;  // f: expert hidden width
};

Plan make_plan(const at::Tensor& order, const at::Tensor& token_of, const at::Tensor& offsets,
               const at::Tensor& w_gate) {
  return Plan{order.data_ptr<int64_t>(),
              token_of.data_ptr<int64_t>(),
              offsets.data_ptr<int64_t>(),
              w_gate.size(0),
              w_gate.size(2),
              w_gate.size(1)};
}

// Each expert's sorted range [begin, end), in tiles of up to kTile slots, in order: weight
// gradients accumulate tile by tile.
// `body(expert, p0, n, scratch)`; `setup(expert, scratch)` runs before an expert's first tile.
template <typename T, typename Setup, typename Body>
void for_each_tile(const Plan& plan, int64_t scratch_size, const Setup& setup, const Body& body) {
  std::vector<T> scratch(scratch_size);
  for (int64_t e = 0; e < plan.num_experts; ++e) {
    if (plan.offsets[e] == plan.offsets[e + 1]) continue;
    setup(e, scratch.data());
    for (int64_t p0 = plan.offsets[e]; p0 < plan.offsets[e + 1]; p0 += kTile) {
      body(e, p0, std::min(kTile, plan.offsets[e + 1] - p0), scratch.data());
    }
  }
}

// out[t, :] = sum_j rows[position[t * k + j], :], j in order (deterministic per token); the sum
// stays in registers (adding into `out` row by row stalled on its stores).
template <typename T>
void sum_by_token(const T* rows, const int64_t* position, int64_t num_tokens, int64_t top_k,
                  int64_t width, T* out) {
  constexpr int64_t L = Vec<T>::size();
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t* slots = position + t * top_k;
    for (int64_t c = 0; c < width; c += L) {
      const int64_t count = std::min(L, width - c);
      Vec<T> sum = load(rows + slots[0] * width + c, count);
      for (int64_t j = 1; j < top_k; ++j) sum = sum + load(rows + slots[j] * width + c, count);
      store(sum, out + t * width + c, count);
    }
  }
}

// dst[0:n] = src[0:n], row[0:n] *= value, dst[0:n] = value, in whole vectors: the rows here are a
// few elements wide, where a scalar loop or a memmove call costs more than the work.
template <typename T>
void copy_row(const T* src, T* dst, int64_t n) {
  constexpr int64_t L = Vec<T>::size();
  for (int64_t i = 0; i < n; i += L) {
    const int64_t count = std::min(L, n - i);
    store(load(src + i, count), dst + i, count);
  }
}

template <typename T>
void scale_row(T value, T* row, int64_t n) {
  constexpr int64_t L = Vec<T>::size();
  for (int64_t i = 0; i < n; i += L) {
    const int64_t count = std::min(L, n - i);
    store(load(row + i, count) * Vec<T>(value), row + i, count);
  }
}

template <typename T>
void fill_row(T value, T* dst, int64_t n) {
  constexpr int64_t L = Vec<T>::size();
  for (int64_t i = 0; i < n; i += L) store(Vec<T>(value), dst + i, std::min(L, n - i));
}

void check_experts(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                   const at::Tensor& w_down) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x: expected contiguous [N, a]");
  TORCH_CHECK(
      w_gate.dim() == 3 && w_gate.is_contiguous() && w_up.is_contiguous() && w_down.is_contiguous(),
      "expert weights: expected contiguous [E, f, a], [E, f, a], [E, a, f]");
  TORCH_CHECK(w_gate.sizes() == w_up.sizes() && w_gate.size(2) == x.size(1) &&
                  w_down.size(0) == w_gate.size(0) && w_down.size(1) == w_gate.size(2) &&
                  w_down.size(2) == w_gate.size(1),
              "expert weights: shapes do not match x and each other");
  TORCH_CHECK(x.scalar_type() == w_gate.scalar_type() && x.scalar_type() == w_up.scalar_type() &&
                  x.scalar_type() == w_down.scalar_type(),
              "x and expert weights must share one dtype");
}

}  // namespace

// h = act(gate, up) for contiguous tensors of one shape.
at::Tensor glu_forward_op(const at::Tensor& gate, const at::Tensor& up, int64_t kind, double beta,
                          double linear_beta) {
  TORCH_CHECK(gate.is_contiguous() && up.is_contiguous() && gate.sizes() == up.sizes(),
              "gate, up: expected contiguous tensors of one shape");
  auto out = at::empty_like(gate);
  const Activation act{kind, beta, linear_beta};
  AT_DISPATCH_FLOATING_TYPES(gate.scalar_type(), "glu_forward", [&] {
    const scalar_t* g = gate.data_ptr<scalar_t>();
    const scalar_t* u = up.data_ptr<scalar_t>();
    scalar_t* h = out.data_ptr<scalar_t>();
    glu_forward(act, g, u, h, gate.numel());
  });
  return out;
}

std::vector<at::Tensor> glu_backward_op(const at::Tensor& gate, const at::Tensor& up,
                                        const at::Tensor& grad_out, int64_t kind, double beta,
                                        double linear_beta) {
  TORCH_CHECK(gate.is_contiguous() && up.is_contiguous() && grad_out.is_contiguous() &&
                  gate.sizes() == up.sizes() && gate.sizes() == grad_out.sizes(),
              "gate, up, grad: expected contiguous tensors of one shape");
  auto grad_gate = at::empty_like(gate), grad_up = at::empty_like(up);
  const Activation act{kind, beta, linear_beta};
  AT_DISPATCH_FLOATING_TYPES(gate.scalar_type(), "glu_backward", [&] {
    const scalar_t* g = gate.data_ptr<scalar_t>();
    const scalar_t* u = up.data_ptr<scalar_t>();
    const scalar_t* dh = grad_out.data_ptr<scalar_t>();
    scalar_t* dg = grad_gate.data_ptr<scalar_t>();
    scalar_t* du = grad_up.data_ptr<scalar_t>();
    glu_backward(act, g, u, dh, dg, du, gate.numel());
  });
  return {grad_gate, grad_up};
}

// Forward of the routed experts. Returns {out [N, a], pre [Nk * 2f]}: the gate and up
// pre-activations for the backward, per tile of n slots starting at p0 a gate block [n, f] then
// an up block [n, f] at p0 * 2f. Token rows are read in place; the gate and up projections run as
// one GEMM against [W_g; W_u]^T, and the activation runs over whole blocks (full vectors even
// when f is narrower than one).
//   x [N, a]; weight [Nk] routing weight of each flat assignment t * k + j (x's dtype);
//   order [Nk] flat assignment of each sorted slot; token_of [Nk]; position [Nk] sorted slot of
//   each flat assignment; offsets [E + 1] (the plan of `plan_dispatch_op`).
std::vector<at::Tensor> experts_forward_op(const at::Tensor& x, const at::Tensor& weight_flat,
                                           const at::Tensor& order, const at::Tensor& token_of,
                                           const at::Tensor& position, const at::Tensor& offsets,
                                           const at::Tensor& w_gate, const at::Tensor& w_up,
                                           const at::Tensor& w_down, int64_t kind, double beta,
                                           double linear_beta) {
  check_experts(x, w_gate, w_up, w_down);
  const Activation act{kind, beta, linear_beta};
  const Plan plan = make_plan(order, token_of, offsets, w_gate);
  const int64_t a = plan.width, f = plan.hidden, num_slots = token_of.numel();
  auto pre = at::empty({num_slots * 2 * f}, x.options());
  auto rows = at::empty({num_slots, a}, x.options());
  auto out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "experts_forward", [&] {
    using T = scalar_t;
    const T *xs = x.data_ptr<T>(), *weight = weight_flat.data_ptr<T>();
    const T *wg = w_gate.data_ptr<T>(), *wu = w_up.data_ptr<T>(), *wd = w_down.data_ptr<T>();
    T *pre_all = pre.data_ptr<T>(), *row_all = rows.data_ptr<T>();
    // Scratch: [W_g; W_u]^T [a, 2f], W_d^T [f, a], a tile's projections [kTile, 2f] and hidden
    // rows [kTile, f].
    const int64_t scratch_size = 3 * a * f + 3 * kTile * f;
    auto setup = [&](int64_t e, T* scratch) {
      for (int64_t c = 0; c < a; ++c) {
        for (int64_t i = 0; i < f; ++i) {
          scratch[c * 2 * f + i] = wg[(e * f + i) * a + c];
          scratch[c * 2 * f + f + i] = wu[(e * f + i) * a + c];
        }
      }
      transpose(wd + e * a * f, a, f, scratch + 2 * a * f);
    };
    for_each_tile<T>(plan, scratch_size, setup, [&](int64_t, int64_t p0, int64_t n, T* scratch) {
      const T *wgu_t = scratch, *wd_t = scratch + 2 * a * f;
      T *gu = scratch + 3 * a * f, *hidden = gu + 2 * kTile * f;
      T *g = pre_all + p0 * 2 * f, *u = g + n * f;
      const T* token_row[kTile];
      for (int64_t t = 0; t < n; ++t) token_row[t] = xs + plan.token_of[p0 + t] * a;
      gemm<false, true, T>([&](int64_t t, int64_t c) { return token_row[t][c]; },
                           [&](int64_t c) { return wgu_t + c * 2 * f; },
                           [&](int64_t t) { return gu + t * 2 * f; }, n, a, 2 * f);
      for (int64_t t = 0; t < n; ++t) {
        copy_row(gu + t * 2 * f, g + t * f, f);
        copy_row(gu + t * 2 * f + f, u + t * f, f);
      }
      glu_forward(act, g, u, hidden, n * f);
      for (int64_t t = 0; t < n; ++t) scale_row(weight[plan.order[p0 + t]], hidden + t * f, f);
      gemm<false, true, T>([&](int64_t t, int64_t i) { return hidden[t * f + i]; },
                           [&](int64_t i) { return wd_t + i * a; },
                           [&](int64_t t) { return row_all + (p0 + t) * a; }, n, f, a);
    });
    sum_by_token(row_all, position.data_ptr<int64_t>(), x.size(0), position.numel() / x.size(0), a,
                 out.data_ptr<T>());
  });
  return {out, pre};
}

// One pass over a tile's m = n * f hidden elements (whole vectors): from d(weighted hidden), the
// pre-activations g, u and each element's routing weight w, the weighted hidden, dg, du and the
// products d(weighted hidden) * hidden (a row's sum is its routing weight's gradient).
template <typename T>
void expert_hidden_backward(const Activation& act, const T* g, const T* u, const T* d_weighted,
                            const T* w, int64_t m, T* weighted, T* dg, T* du, T* product) {
  using V = Vec<T>;
  for (int64_t i = 0; i < m; i += V::size()) {
    const int64_t count = std::min<int64_t>(V::size(), m - i);
    V h, dh_dg, dh_du;
    glu_partials(act, load(g + i, count), load(u + i, count), h, dh_dg, dh_du);
    const V grad = load(d_weighted + i, count), vw = load(w + i, count);
    store(grad * h, product + i, count);
    store(h * vw, weighted + i, count);
    const V dh = grad * vw;
    store(dh * dh_dg, dg + i, count);
    store(dh * dh_du, du + i, count);
  }
}

// Backward: {grad_x [N, a], grad_weight [Nk] (flat order), grad_w_gate, grad_w_up, grad_w_down}.
std::vector<at::Tensor> experts_backward_op(const at::Tensor& grad_out, const at::Tensor& x,
                                            const at::Tensor& weight_flat, const at::Tensor& order,
                                            const at::Tensor& token_of, const at::Tensor& position,
                                            const at::Tensor& offsets, const at::Tensor& w_gate,
                                            const at::Tensor& w_up, const at::Tensor& w_down,
                                            const at::Tensor& pre, int64_t kind, double beta,
                                            double linear_beta) {
  check_experts(x, w_gate, w_up, w_down);
  TORCH_CHECK(grad_out.is_contiguous() && grad_out.sizes() == x.sizes(),
              "grad_out: expected contiguous, shaped like x");
  const Activation act{kind, beta, linear_beta};
  const Plan plan = make_plan(order, token_of, offsets, w_gate);
  const int64_t a = plan.width, f = plan.hidden, num_slots = token_of.numel();
  auto grad_rows = at::empty({num_slots, a}, x.options());
  auto grad_x = at::empty_like(x);
  auto grad_weight = at::empty({num_slots}, x.options());
  auto grad_gate_w = at::zeros_like(w_gate), grad_up_w = at::zeros_like(w_up);
  // dW_d accumulates transposed, [E, f, a]: rows of width a fill the vectors where f is narrow.
  auto grad_down_t = at::zeros({plan.num_experts, f, a}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "experts_backward", [&] {
    using T = scalar_t;
    const T *xs = x.data_ptr<T>(), *dy = grad_out.data_ptr<T>();
    const T* weight = weight_flat.data_ptr<T>();
    const T *wg = w_gate.data_ptr<T>(), *wu = w_up.data_ptr<T>(), *wd = w_down.data_ptr<T>();
    const T* pre_all = pre.data_ptr<T>();
    T *dwg = grad_gate_w.data_ptr<T>(), *dwu = grad_up_w.data_ptr<T>();
    T* dwd_t = grad_down_t.data_ptr<T>();
    T *dw_all = grad_weight.data_ptr<T>(), *drow_all = grad_rows.data_ptr<T>();
    // Scratch per tile, each [kTile, f]: d(weighted hidden), weighted hidden, dg, du, routing
    // weights per element, products.
    const int64_t scratch_size = 6 * kTile * f;
    auto setup = [](int64_t, T*) {};
    for_each_tile<T>(plan, scratch_size, setup, [&](int64_t e, int64_t p0, int64_t n, T* scratch) {
      T *d_weighted = scratch, *weighted = d_weighted + kTile * f, *dg = weighted + kTile * f;
      T *du = dg + kTile * f, *w = du + kTile * f, *product = w + kTile * f;
      const T *g = pre_all + p0 * 2 * f, *u = g + n * f;
      const T* token_row[kTile];
      const T* grad_row[kTile];
      for (int64_t t = 0; t < n; ++t) {
        token_row[t] = xs + plan.token_of[p0 + t] * a;
        grad_row[t] = dy + plan.token_of[p0 + t] * a;
        fill_row(weight[plan.order[p0 + t]], w + t * f, f);
      }
      const T *wg_e = wg + e * f * a, *wu_e = wu + e * f * a, *wd_e = wd + e * a * f;
      // d(weighted hidden) [n, f] = dy W_d (W_d[e] is [a, f]).
      gemm<false, true, T>([&](int64_t t, int64_t c) { return grad_row[t][c]; },
                           [&](int64_t c) { return wd_e + c * f; },
                           [&](int64_t t) { return d_weighted + t * f; }, n, a, f);
      expert_hidden_backward(act, g, u, d_weighted, w, n * f, weighted, dg, du, product);
      for (int64_t t = 0; t < n; ++t) {
        T sum = 0;
        for (int64_t i = 0; i < f; ++i) sum += product[t * f + i];
        dw_all[plan.order[p0 + t]] = sum;
      }
      // Weight gradients, reduced over the tile's tokens: dW_d^T [f, a] += weighted^T dy,
      // dW_g [f, a] += dg^T x, dW_u [f, a] += du^T x.
      auto grad = [&](int64_t t) { return grad_row[t]; };
      gemm<true, false, T>([&](int64_t i, int64_t t) { return weighted[t * f + i]; }, grad,
                           [&](int64_t i) { return dwd_t + (e * f + i) * a; }, f, n, a);
      auto token = [&](int64_t t) { return token_row[t]; };
      gemm<true, false, T>([&](int64_t i, int64_t t) { return dg[t * f + i]; }, token,
                           [&](int64_t i) { return dwg + (e * f + i) * a; }, f, n, a);
      gemm<true, false, T>([&](int64_t i, int64_t t) { return du[t * f + i]; }, token,
                           [&](int64_t i) { return dwu + (e * f + i) * a; }, f, n, a);
      // dx rows [n, a] = dg W_g + du W_u.
      auto dx_row = [&](int64_t t) { return drow_all + (p0 + t) * a; };
      gemm<false, true, T>([&](int64_t t, int64_t i) { return dg[t * f + i]; },
                           [&](int64_t i) { return wg_e + i * a; }, dx_row, n, f, a);
      gemm<true, true, T>([&](int64_t t, int64_t i) { return du[t * f + i]; },
                          [&](int64_t i) { return wu_e + i * a; }, dx_row, n, f, a);
    });
    sum_by_token(drow_all, position.data_ptr<int64_t>(), x.size(0), position.numel() / x.size(0), a,
                 grad_x.data_ptr<T>());
  });
  return {grad_x, grad_weight, grad_gate_w, grad_up_w, grad_down_t.transpose(1, 2).contiguous()};
}

template <int64_t C>
void select_top_block(const float* block, int64_t num_experts, int64_t count, float* lane_values,
                      float* lane_index) {
  using V = Vec<float>;
  constexpr int64_t L = V::size();
  using Slots = std::conditional_t<(C > 0), std::array<V, (C > 0 ? C : 1)>, std::vector<V>>;
  Slots vals{}, idx{};
  if constexpr (C == 0) {
    vals.resize(count);
    idx.resize(count);
  }
  const int64_t slots = C > 0 ? C : count;
  for (int64_t p = 0; p < slots; ++p) {
    vals[p] = V(-std::numeric_limits<float>::infinity());
    idx[p] = V(-1.f);
  }
  for (int64_t e = 0; e < num_experts; ++e) {
    V candidate = V::loadu(block + e * L);
    V candidate_index{float(e)};
#pragma GCC unroll 8
    for (int64_t p = 0; p < slots; ++p) {
      // Order by (value desc, expert asc): a displaced entry moving down must still pass
      // an equal value held by a higher expert.
      const V greater =
          (candidate > vals[p]) | ((candidate == vals[p]) & (candidate_index < idx[p]));
      const V kept = V::blendv(vals[p], candidate, greater);
      candidate = V::blendv(candidate, vals[p], greater);
      vals[p] = kept;
      const V kept_index = V::blendv(idx[p], candidate_index, greater);
      candidate_index = V::blendv(candidate_index, idx[p], greater);
      idx[p] = kept_index;
    }
  }
  for (int64_t p = 0; p < slots; ++p) {
    vals[p].store(lane_values + p * L);
    idx[p].store(lane_index + p * L);
  }
}

// Top `count` of biased = scores + bias per row: {values [N, count] fp32, index [N, count]
// int64}, larger first, the lower expert first on ties (torch.topk leaves tie order open).
// Vectorised across rows: each vector lane is one row (select_top_block). Rows whose values are
// all NaN or -inf (never from a sigmoid) fall back to a scalar fill, so indices are always valid
// and distinct.
std::vector<at::Tensor> select_top_op(const at::Tensor& scores, const at::Tensor& bias,
                                      int64_t count) {
  TORCH_CHECK(scores.dim() == 2 && scores.is_contiguous() && scores.scalar_type() == at::kFloat &&
                  bias.scalar_type() == at::kFloat && bias.is_contiguous() &&
                  bias.numel() == scores.size(1),
              "select_top: expected contiguous fp32 scores [N, E] and bias [E]");
  const int64_t num_rows = scores.size(0), num_experts = scores.size(1);
  TORCH_CHECK(count >= 1 && count <= num_experts, "select_top: count must be in [1, E]");
  auto values = at::empty({num_rows, count}, scores.options());
  auto index = at::empty({num_rows, count}, scores.options().dtype(at::kLong));
  const float *s = scores.data_ptr<float>(), *b = bias.data_ptr<float>();
  float* out_values = values.data_ptr<float>();
  int64_t* out_index = index.data_ptr<int64_t>();
  constexpr int64_t L = Vec<float>::size();
  using BlockFn = void (*)(const float*, int64_t, int64_t, float*, float*);
  // Fixed counts cover top-k and top-(k+1) of every ladder and preset (k <= 8).
  constexpr BlockFn kFixed[] = {select_top_block<0>, select_top_block<1>, select_top_block<2>,
                                select_top_block<3>, select_top_block<4>, select_top_block<5>,
                                select_top_block<6>, select_top_block<7>, select_top_block<8>,
                                select_top_block<9>};
  const BlockFn select = count < int64_t(std::size(kFixed)) ? kFixed[count] : kFixed[0];
  std::vector<float> block(num_experts * L), lane_values(count * L), lane_index(count * L);
  const auto row_offsets = Vec<int32_t>::arange(0, int32_t(num_experts));  // lane l: row l
  for (int64_t r0 = 0; r0 < num_rows; r0 += L) {
    const int64_t rows = std::min(L, num_rows - r0);
    if (rows == L) {  // one gather per expert column (a scalar transpose took 40% of route)
      for (int64_t e = 0; e < num_experts; ++e) {
        const auto column = at::vec::gather<4>(s + r0 * num_experts + e, row_offsets);
        (column + Vec<float>(b[e])).store(block.data() + e * L);
      }
    } else {
      for (int64_t l = 0; l < L; ++l) {
        for (int64_t e = 0; e < num_experts; ++e) {
          block[e * L + l] = l < rows ? s[(r0 + l) * num_experts + e] + b[e] : 0.f;
        }
      }
    }
    select(block.data(), num_experts, count, lane_values.data(), lane_index.data());
    for (int64_t l = 0; l < rows; ++l) {
      for (int64_t p = 0; p < count; ++p) {
        out_values[(r0 + l) * count + p] = lane_values[p * L + l];
        out_index[(r0 + l) * count + p] = int64_t(lane_index[p * L + l]);
      }
      fill_unselected(out_index + (r0 + l) * count, count);
    }
  }
  return {values, index};
}

// The router after its linear map (architecture.md 5.1), fp32: scores = sigmoid(logits);
// selection = top `count` of scores + bias (select_top's order); weights = rho * s_sel / sum s_sel
// over the first k selections. Returns {scores [N, E], values [N, count], index [N, count],
// weights [N, k]}.
std::vector<at::Tensor> route_forward_op(const at::Tensor& logits, const at::Tensor& bias,
                                         int64_t top_k, int64_t count, double routed_scale) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.scalar_type() == at::kFloat,
              "route: expected contiguous fp32 logits [N, E]");
  TORCH_CHECK(top_k >= 1 && top_k <= count, "route: need 1 <= top_k <= count");
  auto scores = at::empty_like(logits);
  {
    using V = Vec<float>;
    const float* in = logits.data_ptr<float>();
    float* out = scores.data_ptr<float>();
    const int64_t n = logits.numel();
    for (int64_t i = 0; i < n; i += V::size()) {
      const int64_t m = std::min<int64_t>(V::size(), n - i);
      store(sigmoid_accurate(load(in + i, m)), out + i, m);
    }
  }
  auto selection = select_top_op(scores, bias, count);
  const auto& index = selection[1];
  const int64_t num_rows = logits.size(0), num_experts = logits.size(1);
  auto weights = at::empty({num_rows, top_k}, logits.options());
  const float* s = scores.data_ptr<float>();
  const int64_t* idx = index.data_ptr<int64_t>();
  float* w = weights.data_ptr<float>();
  for (int64_t row = 0; row < num_rows; ++row) {
    float total = 0;
    for (int64_t j = 0; j < top_k; ++j) total += s[row * num_experts + idx[row * count + j]];
    const float scale = float(routed_scale) / total;
    for (int64_t j = 0; j < top_k; ++j) {
      w[row * top_k + j] = scale * s[row * num_experts + idx[row * count + j]];
    }
  }
  return {scores, selection[0], index, weights};
}

// Gradient of route_forward's logits from those of scores and weights.
at::Tensor route_backward_op(const at::Tensor& grad_scores, const at::Tensor& grad_weights,
                             const at::Tensor& scores, const at::Tensor& index,
                             const at::Tensor& weights, double routed_scale) {
  const int64_t num_rows = scores.size(0), num_experts = scores.size(1);
  const int64_t top_k = weights.size(1), count = index.size(1);
  // An empty grad_scores stands for zeros (scores unused downstream).
  auto grad = grad_scores.numel() ? grad_scores.contiguous().clone() : at::zeros_like(scores);
  const auto dw_c = grad_weights.contiguous();
  const float *s = scores.data_ptr<float>(), *w = weights.data_ptr<float>();
  const float* dw = dw_c.data_ptr<float>();
  const int64_t* idx = index.data_ptr<int64_t>();
  float* ds = grad.data_ptr<float>();
  for (int64_t row = 0; row < num_rows; ++row) {
    // w_j = rho c_j / S: dc_m = (dw_m - sum_j dw_j w_j / rho) rho / S.
    float total = 0, projected = 0;
    for (int64_t j = 0; j < top_k; ++j) {
      total += s[row * num_experts + idx[row * count + j]];
      projected += dw[row * top_k + j] * w[row * top_k + j];
    }
    projected /= float(routed_scale);
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t e = idx[row * count + j];
      ds[row * num_experts + e] += (dw[row * top_k + j] - projected) * float(routed_scale) / total;
    }
    for (int64_t e = 0; e < num_experts; ++e) {
      const float sig = s[row * num_experts + e];
      ds[row * num_experts + e] *= sig * (1 - sig);
    }
  }
  return grad;
}

// DeepSeek-V3 sequence-wise balance loss (router.sequence_aux_loss): alpha / B sum_b sum_e
// f_be P_be with f_be = E / (k T) #{t in b : e selected} and P_be = mean_t s_te / sum_e' s_te'.
// Returns {loss (0-dim), coefficient [B, E] = alpha f_be / (B T)}; the backward needs only the
// coefficient: d loss / d s'_te = coefficient[b(t), e].
std::vector<at::Tensor> sequence_aux_forward_op(const at::Tensor& scores, const at::Tensor& index,
                                                int64_t top_k, int64_t num_sequences,
                                                double alpha) {
  TORCH_CHECK(scores.dim() == 2 && scores.is_contiguous() && scores.scalar_type() == at::kFloat,
              "sequence_aux: expected contiguous fp32 scores [N, E]");
  const int64_t num_rows = scores.size(0), num_experts = scores.size(1), count = index.size(1);
  const int64_t seq_len = num_rows / num_sequences;
  auto coefficient = at::zeros({num_sequences, num_experts}, scores.options());
  const float* s = scores.data_ptr<float>();
  const int64_t* idx = index.data_ptr<int64_t>();
  float* coef = coefficient.data_ptr<float>();
  const double f_scale = double(num_experts) / (double(top_k) * double(seq_len));
  double loss = 0;
  std::vector<double> probability(num_experts);
  for (int64_t b = 0; b < num_sequences; ++b) {
    std::fill(probability.begin(), probability.end(), 0.0);
    float* c = coef + b * num_experts;
    for (int64_t t = b * seq_len; t < (b + 1) * seq_len; ++t) {
      double total = 0;
      for (int64_t e = 0; e < num_experts; ++e) total += s[t * num_experts + e];
      const double inverse = 1.0 / total;  // one division per token, not per expert
      for (int64_t e = 0; e < num_experts; ++e) probability[e] += s[t * num_experts + e] * inverse;
      for (int64_t j = 0; j < top_k; ++j) c[idx[t * count + j]] += 1;
    }
    for (int64_t e = 0; e < num_experts; ++e) {
      const double fraction = f_scale * c[e];
      loss += fraction * probability[e] / double(seq_len);
      c[e] = float(alpha * fraction / (double(num_sequences) * double(seq_len)));
    }
  }
  return {at::scalar_tensor(alpha * loss / double(num_sequences), scores.options()), coefficient};
}

// d loss / d scores [N, E] for the loss of sequence_aux_forward_op, times grad_loss.
at::Tensor sequence_aux_backward_op(const at::Tensor& grad_loss, const at::Tensor& scores,
                                    const at::Tensor& coefficient) {
  const int64_t num_rows = scores.size(0), num_experts = scores.size(1);
  const int64_t seq_len = num_rows / coefficient.size(0);
  auto grad = at::empty_like(scores);
  const float upstream = grad_loss.item<float>();
  const float *s = scores.data_ptr<float>(), *coef = coefficient.data_ptr<float>();
  float* ds = grad.data_ptr<float>();
  for (int64_t t = 0; t < num_rows; ++t) {
    // s'_e = s_e / Z: ds_m = (g_m - sum_e g_e s'_e) / Z with g = coefficient of t's sequence.
    const float* c = coef + (t / seq_len) * num_experts;
    float total = 0, projected = 0;
    for (int64_t e = 0; e < num_experts; ++e) total += s[t * num_experts + e];
    for (int64_t e = 0; e < num_experts; ++e) projected += c[e] * s[t * num_experts + e];
    const float scale = upstream / total;
    projected /= total;
    for (int64_t e = 0; e < num_experts; ++e) ds[t * num_experts + e] = scale * (c[e] - projected);
  }
  return grad;
}

// Quantile Balancing margin counts (ops/qb/histogram.margin_counts): [E, 1 + R] int64. Column 0
// counts each token's (k+1)-th expert (the point mass); the other margins s - cutoff fall into R
// bins of width `width` from `lo`, out-of-range (and NaN) clamped. The bin arithmetic is the same
// fp64 subtract, subtract, divide, floor as the torch version, so the counts are identical.
at::Tensor margin_counts_op(const at::Tensor& scores, const at::Tensor& cutoff,
                            const at::Tensor& cutoff_expert, double lo, double width,
                            int64_t num_bins) {
  TORCH_CHECK(scores.dim() == 2 && scores.is_contiguous() && scores.scalar_type() == at::kFloat,
              "margin_counts: expected contiguous fp32 scores [N, E]");
  const int64_t num_rows = scores.size(0), num_experts = scores.size(1);
  auto counts = at::zeros({num_experts, num_bins + 1}, cutoff_expert.options());
  const auto cutoff_c = cutoff.contiguous().to(at::kFloat);
  const auto expert_c = cutoff_expert.contiguous();
  const float *s = scores.data_ptr<float>(), *c = cutoff_c.data_ptr<float>();
  const int64_t* owner = expert_c.data_ptr<int64_t>();
  int64_t* out = counts.data_ptr<int64_t>();
  for (int64_t t = 0; t < num_rows; ++t) {
    const double alpha = c[t];
    for (int64_t e = 0; e < num_experts; ++e) {
      if (e == owner[t]) {
        ++out[e * (num_bins + 1)];
        continue;
      }
      const double position = std::floor((double(s[t * num_experts + e]) - alpha - lo) / width);
      const int64_t bin =
          position >= 0 ? std::min<int64_t>(int64_t(std::min(position, 1e18)), num_bins - 1) : 0;
      ++out[e * (num_bins + 1) + 1 + bin];
    }
  }
  return counts;
}

// Counting sort of the [N, k] selections by expert (stable: token order within an expert):
// {order [Nk] flat assignment of each sorted slot, token_of [Nk], position [Nk] sorted slot of
// each flat assignment, offsets [E + 1]}.
std::vector<at::Tensor> plan_dispatch_op(const at::Tensor& expert_idx, int64_t num_experts) {
  TORCH_CHECK(
      expert_idx.dim() == 2 && expert_idx.is_contiguous() && expert_idx.scalar_type() == at::kLong,
      "plan_dispatch: expected contiguous int64 [N, k]");
  const int64_t top_k = expert_idx.size(1), total = expert_idx.numel();
  const int64_t* flat = expert_idx.data_ptr<int64_t>();
  auto options = expert_idx.options();
  auto order = at::empty({total}, options), token_of = at::empty({total}, options);
  auto position = at::empty({total}, options), offsets = at::zeros({num_experts + 1}, options);
  int64_t *o = order.data_ptr<int64_t>(), *t = token_of.data_ptr<int64_t>();
  int64_t *p = position.data_ptr<int64_t>(), *off = offsets.data_ptr<int64_t>();
  for (int64_t i = 0; i < total; ++i) {
    TORCH_CHECK(flat[i] >= 0 && flat[i] < num_experts, "plan_dispatch: expert ", flat[i],
                " out of range [0, ", num_experts, ")");
    ++off[flat[i] + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) off[e + 1] += off[e];
  std::vector<int64_t> cursor(off, off + num_experts);
  for (int64_t i = 0; i < total; ++i) {
    const int64_t slot = cursor[flat[i]]++;
    o[slot] = i;
    t[slot] = i / top_k;
    p[i] = slot;
  }
  return {order, token_of, position, offsets};
}

// KDA's short convolution (models/kda._causal_conv_silu): a causal depthwise conv over time and
// SiLU, in the [B, T, P] layout of the projections (the torch path transposes to [B, P, T] for
// conv1d, and SiLU's backward then ran about 8x slower on the strided gradient).
//   padded [B, T + K - 1, P] = the previous K - 1 inputs, then x; weight [P, K].
//   pre[b, t, p] = sum_k weight[p, k] padded[b, t + k, p]; y = silu(pre). Returns {y, pre}.
std::vector<at::Tensor> conv_silu_forward_op(const at::Tensor& padded, const at::Tensor& weight) {
  TORCH_CHECK(padded.dim() == 3 && padded.is_contiguous() && weight.dim() == 2 &&
                  weight.size(0) == padded.size(2) && padded.size(1) >= weight.size(1) &&
                  padded.scalar_type() == weight.scalar_type(),
              "conv_silu: expected contiguous padded [B, T + K - 1, P] and weight [P, K]");
  const int64_t batch = padded.size(0), width = padded.size(2), taps = weight.size(1);
  const int64_t steps = padded.size(1) - taps + 1;
  auto pre = at::empty({batch, steps, width}, padded.options());
  auto out = at::empty_like(pre);
  AT_DISPATCH_FLOATING_TYPES(padded.scalar_type(), "conv_silu_forward", [&] {
    using T = scalar_t;
    using V = Vec<T>;
    const auto weight_t = weight.t().contiguous();  // [K, P]: one tap's row is contiguous
    const T *in = padded.data_ptr<T>(), *w = weight_t.data_ptr<T>();
    T *pre_all = pre.data_ptr<T>(), *y = out.data_ptr<T>();
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < steps; ++t) {
        const T* window = in + (b * padded.size(1) + t) * width;
        const int64_t row = (b * steps + t) * width;
        for (int64_t p = 0; p < width; p += V::size()) {
          const int64_t count = std::min<int64_t>(V::size(), width - p);
          V acc(T(0));
          for (int64_t k = 0; k < taps; ++k) {
            acc = at::vec::fmadd(load(w + k * width + p, count),
                                 load(window + k * width + p, count), acc);
          }
          store(acc, pre_all + row + p, count);
          store(acc * sigmoid_accurate(acc), y + row + p, count);
        }
      }
    }
  });
  return {out, pre};
}

// Backward of conv_silu_forward_op: {grad_padded [B, T + K - 1, P], grad_weight [P, K]}, with
// silu'(x) = s (1 + x (1 - s)), s = sigmoid(x).
std::vector<at::Tensor> conv_silu_backward_op(const at::Tensor& grad_y_any,
                                              const at::Tensor& padded, const at::Tensor& weight,
                                              const at::Tensor& pre) {
  const auto grad_y = grad_y_any.contiguous();
  TORCH_CHECK(grad_y.sizes() == pre.sizes(), "conv_silu_backward: grad_y must match the output");
  const int64_t batch = padded.size(0), width = padded.size(2), taps = weight.size(1);
  const int64_t steps = pre.size(1);
  auto grad_padded = at::zeros_like(padded);
  auto grad_weight_t = at::zeros({taps, width}, weight.options());  // [K, P], transposed back
  AT_DISPATCH_FLOATING_TYPES(padded.scalar_type(), "conv_silu_backward", [&] {
    using T = scalar_t;
    using V = Vec<T>;
    const auto weight_t = weight.t().contiguous();
    const T *in = padded.data_ptr<T>(), *w = weight_t.data_ptr<T>();
    const T *pre_all = pre.data_ptr<T>(), *dy = grad_y.data_ptr<T>();
    T *d_in = grad_padded.data_ptr<T>(), *dw = grad_weight_t.data_ptr<T>();
    const V one(T(1));
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < steps; ++t) {
        const int64_t window = (b * padded.size(1) + t) * width;
        const int64_t row = (b * steps + t) * width;
        for (int64_t p = 0; p < width; p += V::size()) {
          const int64_t count = std::min<int64_t>(V::size(), width - p);
          const V x = load(pre_all + row + p, count), s = sigmoid_accurate(x);
          const V d_pre = load(dy + row + p, count) * s * (one + x * (one - s));
          for (int64_t k = 0; k < taps; ++k) {
            T* d_in_k = d_in + window + k * width + p;
            store(at::vec::fmadd(load(w + k * width + p, count), d_pre, load(d_in_k, count)),
                  d_in_k, count);
            T* dw_k = dw + k * width + p;
            store(
                at::vec::fmadd(load(in + window + k * width + p, count), d_pre, load(dw_k, count)),
                dw_k, count);
          }
        }
      }
    }
  });
  return {grad_padded, grad_weight_t.t().contiguous()};
}

// Cross-entropy of one chunk of output-head logits stored transposed, [V, R]: one column per
// row of the chunk (ops/head_ce/chunked.py, `_nll_into_gradient_torch`). Each column becomes
// (softmax - onehot(target)) * scale in place, in three sweeps down the vocabulary (max; exp and
// sum; scale) over a block of N vectors of columns whose maxima and sums stay in registers.
// Writes each column's NLL to nll[column].
template <typename T, int64_t N>
void xent_column_block(T* data, int64_t vocab, int64_t stride, int64_t first, int64_t width,
                       const int64_t* target, T scale, double* nll) {
  using V = Vec<T>;
  constexpr int64_t L = V::size();
  int64_t count[N];
  for (int64_t i = 0; i < N; ++i) count[i] = std::min<int64_t>(L, width - i * L);
  T* block = data + first;
  V vmax[N], vsum[N];
  for (int64_t i = 0; i < N; ++i) {
    vmax[i] = V(-std::numeric_limits<T>::infinity());
    vsum[i] = V(T(0));
  }
  for (int64_t v = 0; v < vocab; ++v) {
    const T* row = block + v * stride;
    for (int64_t i = 0; i < N; ++i)
      vmax[i] = at::vec::maximum(vmax[i], load(row + i * L, count[i]));
  }
  T maxima[N * L], sums[N * L], picked[N * L];
  for (int64_t i = 0; i < N; ++i) vmax[i].store(maxima + i * L);
  for (int64_t c = 0; c < width; ++c) picked[c] = block[target[first + c] * stride + c];
  // Sums in two levels (runs of kSumRun rows, then the runs): rounding grows with about
  // kSumRun + vocab / kSumRun terms instead of vocab; one chain over V 8192 missed torch's
  // (cascaded) column sums by 5e-6 relative in fp32.
  constexpr int64_t kSumRun = 64;
  for (int64_t run = 0; run < vocab; run += kSumRun) {
    V partial[N];
    for (int64_t i = 0; i < N; ++i) partial[i] = V(T(0));
    for (int64_t v = run; v < std::min(vocab, run + kSumRun); ++v) {
      T* row = block + v * stride;
      for (int64_t i = 0; i < N; ++i) {
        const V e = (load(row + i * L, count[i]) - vmax[i]).exp();
        store(e, row + i * L, count[i]);
        partial[i] = partial[i] + e;
      }
    }
    for (int64_t i = 0; i < N; ++i) vsum[i] = vsum[i] + partial[i];
  }
  V factor[N];
  for (int64_t i = 0; i < N; ++i) {
    vsum[i].store(sums + i * L);
    factor[i] = V(scale) / vsum[i];
  }
  for (int64_t v = 0; v < vocab; ++v) {
    T* row = block + v * stride;
    for (int64_t i = 0; i < N; ++i) {
      store(load(row + i * L, count[i]) * factor[i], row + i * L, count[i]);
    }
  }
  for (int64_t c = 0; c < width; ++c) {
    block[target[first + c] * stride + c] -= scale;
    nll[first + c] = double(std::log(sums[c])) + double(maxima[c]) - double(picked[c]);
  }
}

// The chunk step of the output-head loss (see xent_column_block) over every column, the column
// blocks split across threads. Returns the chunk's summed NLL (0-dim, logits' dtype; summed in
// double in column order, so the result does not depend on the thread count). The [V, R] layout
// lets the three GEMMs around it run 1.2-1.4x faster than [R, V] at d <= 64 (ops/head_ce).
at::Tensor softmax_xent_grad_op(const at::Tensor& logits_t, const at::Tensor& targets,
                                double scale) {
  TORCH_CHECK(logits_t.dim() == 2 && logits_t.is_contiguous(),
              "softmax_xent_grad: expected contiguous transposed logits [V, R]");
  TORCH_CHECK(targets.scalar_type() == at::kLong && targets.numel() == logits_t.size(1),
              "softmax_xent_grad: expected int64 targets [R]");
  const int64_t vocab = logits_t.size(0), cols = logits_t.size(1);
  const auto targets_c = targets.contiguous();
  const int64_t* target = targets_c.data_ptr<int64_t>();
  for (int64_t c = 0; c < cols; ++c) {
    TORCH_CHECK(target[c] >= 0 && target[c] < vocab, "softmax_xent_grad: target ", target[c],
                " out of range");
  }
  std::vector<double> nll(cols);
  AT_DISPATCH_FLOATING_TYPES(logits_t.scalar_type(), "softmax_xent_grad", [&] {
    using T = scalar_t;
    constexpr int64_t L = Vec<T>::size();
    constexpr int64_t kBlockVecs = 4;
    constexpr int64_t kBlock = kBlockVecs * L;
    T* data = logits_t.data_ptr<T>();
    at::parallel_for(0, (cols + kBlock - 1) / kBlock, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t first = b * kBlock, width = std::min(kBlock, cols - first);
        const auto run = [&](auto vecs) {
          xent_column_block<T, decltype(vecs)::value>(data, vocab, cols, first, width, target,
                                                      T(scale), nll.data());
        };
        switch ((width + L - 1) / L) {
          case 1:
            run(std::integral_constant<int64_t, 1>());
            break;
          case 2:
            run(std::integral_constant<int64_t, 2>());
            break;
          case 3:
            run(std::integral_constant<int64_t, 3>());
            break;
          default:
            run(std::integral_constant<int64_t, kBlockVecs>());
        }
      }
    });
  });
  double total = 0;
  for (const double x : nll) total += x;
  return at::scalar_tensor(total, logits_t.options());
}

// ---- Whole MoE layers, composed from the kernels above: one call per direction. Eager Python
// between the pieces had cost about as much as their arithmetic at the ladder's d = 16-64.

// y = x W^T for the layers' narrow linear maps (the router's, the latent projections'): fp32,
// x [N, a] contiguous, W [b, a]. On the register-blocked GEMM, not MKL: at the ladder's widths
// (a, b of 8-64) sgemm took about twice as long per call here.
at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat &&
                  weight.scalar_type() == at::kFloat && weight.size(1) == x.size(1),
              "linear_rows: expected contiguous fp32 x [N, a] and W [b, a]");
  const int64_t num_rows = x.size(0), a = x.size(1), b = weight.size(0);
  const auto weight_t = weight.t().contiguous();  // [a, b]
  auto out = at::empty({num_rows, b}, x.options());
  const float *xs = x.data_ptr<float>(), *wt = weight_t.data_ptr<float>();
  float* ys = out.data_ptr<float>();
  gemm<false, true, float>([&](int64_t t, int64_t c) { return xs[t * a + c]; },
                           [&](int64_t c) { return wt + c * b; },
                           [&](int64_t t) { return ys + t * b; }, num_rows, a, b);
  return out;
}

// Backward of linear_rows: grad_x (+)= grad_y W (accumulate: add into grad_x); returns
// grad_W = grad_y^T x [b, a].
at::Tensor linear_rows_backward(const at::Tensor& grad_y_any, const at::Tensor& x,
                                const at::Tensor& weight_any, at::Tensor& grad_x, bool accumulate) {
  const auto grad_y = grad_y_any.contiguous(), weight = weight_any.contiguous();
  const int64_t num_rows = x.size(0), a = x.size(1), b = weight.size(0);
  auto grad_weight = at::empty({b, a}, x.options());
  const float *gy = grad_y.data_ptr<float>(), *xs = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float *gx = grad_x.data_ptr<float>(), *gw = grad_weight.data_ptr<float>();
  auto grad_row = [&](int64_t t, int64_t o) { return gy[t * b + o]; };
  auto weight_row = [&](int64_t o) { return w + o * a; };
  auto grad_x_row = [&](int64_t t) { return gx + t * a; };
  if (accumulate) {
    gemm<true, true, float>(grad_row, weight_row, grad_x_row, num_rows, b, a);
  } else {
    gemm<false, true, float>(grad_row, weight_row, grad_x_row, num_rows, b, a);
  }
  gemm<false, false, float>([&](int64_t o, int64_t t) { return gy[t * b + o]; },
                            [&](int64_t t) { return xs + t * a; },
                            [&](int64_t o) { return gw + o * a; }, b, num_rows, a);
  return grad_weight;
}

// Router matmul, route and (alpha > 0) the sequence-wise aux loss: {scores, values, index,
// weights, aux_loss, coefficient (empty when off)}.
std::vector<at::Tensor> route_with_aux(const at::Tensor& x, const at::Tensor& router_weight,
                                       const at::Tensor& bias, int64_t top_k, int64_t count,
                                       double routed_scale, int64_t num_sequences, double alpha) {
  TORCH_CHECK(router_weight.scalar_type() == at::kFloat && router_weight.size(1) == x.size(1),
              "router weight: expected fp32 [E, d]");
  auto routed = route_forward_op(linear_rows(x, router_weight), bias.to(at::kFloat).contiguous(),
                                 top_k, count, routed_scale);
  at::Tensor aux_loss = at::zeros({}, x.options()), coefficient = at::empty({0}, x.options());
  if (alpha > 0) {
    auto aux = sequence_aux_forward_op(routed[0], routed[2], top_k, num_sequences, alpha);
    aux_loss = aux[0];
    coefficient = aux[1];
  }
  routed.push_back(aux_loss);
  routed.push_back(coefficient);
  return routed;
}

// Per-token expert slots for experts_forward: the first `top_k` selections of index [N, count]
// with their routing weights, then `num_shared` experts numbered from `first_shared` that every
// token takes with weight 1. {expert_idx [N, top_k + S], slot weights [N (top_k + S)]}.
std::vector<at::Tensor> slot_assignments(const at::Tensor& index, const at::Tensor& weights,
                                         int64_t top_k, int64_t num_shared, int64_t first_shared) {
  const int64_t num_tokens = index.size(0), count = index.size(1), per_token = top_k + num_shared;
  auto expert_idx = at::empty({num_tokens, per_token}, index.options());
  auto slot_weight = at::empty({num_tokens * per_token}, weights.options());
  const int64_t* idx = index.data_ptr<int64_t>();
  const float* w = weights.data_ptr<float>();
  int64_t* e_out = expert_idx.data_ptr<int64_t>();
  float* w_out = slot_weight.data_ptr<float>();
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      e_out[t * per_token + j] = idx[t * count + j];
      w_out[t * per_token + j] = w[t * top_k + j];
    }
    for (int64_t j = 0; j < num_shared; ++j) {
      e_out[t * per_token + top_k + j] = first_shared + j;
      w_out[t * per_token + top_k + j] = 1.f;
    }
  }
  return {expert_idx, slot_weight};
}

// Tokens routed to each of the first `num_experts` experts, from a dispatch plan's offsets.
at::Tensor loads_of(const at::Tensor& offsets, int64_t num_experts) {
  return offsets.slice(0, 1, num_experts + 1) - offsets.slice(0, 0, num_experts);
}

// The router's backward from the routing weights' gradient [N, k] (and the aux loss's, when
// grad_aux and coefficient are non-empty): adds into grad_x, returns grad_router [E, d].
at::Tensor route_with_aux_backward(const at::Tensor& grad_weights, const at::Tensor& grad_aux,
                                   const at::Tensor& coefficient, const at::Tensor& scores,
                                   const at::Tensor& index, const at::Tensor& weights,
                                   double routed_scale, const at::Tensor& x,
                                   const at::Tensor& router_weight, at::Tensor& grad_x) {
  const auto grad_scores = coefficient.numel() && grad_aux.numel()
                               ? sequence_aux_backward_op(grad_aux, scores, coefficient)
                               : at::empty({0}, scores.options());
  const auto grad_logits =
      route_backward_op(grad_scores, grad_weights, scores, index, weights, routed_scale);
  return linear_rows_backward(grad_logits, x, router_weight, grad_x, true);
}

// The shared GLU's weights appended to the routed experts' as S experts of width f: gate and up
// [S f, a] -> [S, f, a] after [E, f, a]; down [a, S f] -> [S, a, f] after [E, a, f].
at::Tensor stack_shared(const at::Tensor& routed, const at::Tensor& shared, bool down) {
  const int64_t f = routed.size(down ? 2 : 1), a = routed.size(down ? 1 : 2);
  const auto pieces =
      down ? shared.reshape({a, -1, f}).transpose(0, 1) : shared.reshape({-1, f, a});
  return at::cat({routed, pieces});
}

// K2 (no latent; ops/moe/fused.moe_layer_fused): route and aux loss, then routed and shared
// experts in one experts_forward, the shared GLU as S experts of width f. Returns {out,
// aux_loss, scores, index, values, loads [E] (routed tokens per expert)}, then what the backward
// needs: {weights, slot_weight, coefficient, pre, order, token_of, position, offsets, stacked
// gate, up, down}.
std::vector<at::Tensor> moe_layer_forward_op(
    const at::Tensor& x_any, const at::Tensor& router_weight, const at::Tensor& bias,
    const at::Tensor& w_gate_any, const at::Tensor& w_up_any, const at::Tensor& w_down_any,
    const at::Tensor& s_gate, const at::Tensor& s_up, const at::Tensor& s_down, int64_t top_k,
    int64_t count, double routed_scale, int64_t num_sequences, double alpha, int64_t kind,
    double beta, double linear_beta) {
  TORCH_CHECK(x_any.dim() == 2 && x_any.scalar_type() == at::kFloat,
              "moe_layer: expected fp32 x [N, d]");
  const auto x = x_any.contiguous(), w_gate = w_gate_any.contiguous();
  const auto w_up = w_up_any.contiguous(), w_down = w_down_any.contiguous();
  const int64_t num_experts = w_gate.size(0), num_shared = s_gate.size(0) / w_gate.size(1);
  const auto routed =
      route_with_aux(x, router_weight, bias, top_k, count, routed_scale, num_sequences, alpha);
  const at::Tensor &scores = routed[0], &index = routed[2], &weights = routed[3];
  const auto slots = slot_assignments(index, weights, top_k, num_shared, num_experts);
  const auto plan = plan_dispatch_op(slots[0], num_experts + num_shared);
  const auto gate = stack_shared(w_gate, s_gate, false), up = stack_shared(w_up, s_up, false);
  const auto down = stack_shared(w_down, s_down, true);
  auto experts = experts_forward_op(x, slots[1], plan[0], plan[1], plan[2], plan[3], gate, up, down,
                                    kind, beta, linear_beta);
  return {experts[0], routed[4], scores,    index,      routed[1], loads_of(plan[3], num_experts),
          weights,    slots[1],  routed[5], experts[1], plan[0],   plan[1],
          plan[2],    plan[3],   gate,      up,         down};
}

// Backward of moe_layer_forward_op. `saved` is {x, router_weight, scores, index} followed by the
// forward's saved list. Returns {grad_x, grad_router, grad routed gate, up, down, grad shared
// gate, up, down}, the shared ones in the GLU's own layouts. grad_aux is empty when the aux loss
// is off or unused (so too in latent_moe_layer_backward_op).
std::vector<at::Tensor> moe_layer_backward_op(const at::Tensor& grad_out,
                                              const at::Tensor& grad_aux,
                                              const std::vector<at::Tensor>& saved,
                                              double routed_scale, int64_t kind, double beta,
                                              double linear_beta) {
  TORCH_CHECK(saved.size() == 15, "moe_layer_backward: expected 15 saved tensors");
  const at::Tensor &x_any = saved[0], &router_weight = saved[1], &scores = saved[2];
  const at::Tensor &index = saved[3], &weights = saved[4], &slot_weight = saved[5];
  const at::Tensor &coefficient = saved[6], &pre = saved[7], *plan = &saved[8];
  const at::Tensor &gate = saved[12], &up = saved[13], &down = saved[14];
  const auto x = x_any.contiguous();
  const int64_t num_tokens = x.size(0), a = x.size(1), num_experts = scores.size(1);
  const int64_t top_k = weights.size(1), num_shared = gate.size(0) - num_experts;
  auto grads = experts_backward_op(grad_out.contiguous(), x, slot_weight, plan[0], plan[1], plan[2],
                                   plan[3], gate, up, down, pre, kind, beta, linear_beta);
  auto& grad_x = grads[0];
  const auto grad_weights = grads[1].view({num_tokens, top_k + num_shared}).narrow(1, 0, top_k);
  auto grad_router = route_with_aux_backward(grad_weights, grad_aux, coefficient, scores, index,
                                             weights, routed_scale, x, router_weight, grad_x);
  auto shared = [&](const at::Tensor& grad, bool is_down) {
    const auto pieces = grad.narrow(0, num_experts, num_shared);
    return is_down ? pieces.transpose(0, 1).reshape({a, -1}) : pieces.reshape({-1, a});
  };
  return {grad_x,
          grad_router,
          grads[2].narrow(0, 0, num_experts),
          grads[3].narrow(0, 0, num_experts),
          grads[4].narrow(0, 0, num_experts),
          shared(grads[2], false),
          shared(grads[3], false),
          shared(grads[4], true)};
}

// RMSNorm over rows of m [N, l] (models/common.RMSNorm, fp32): {w m r, r = 1 / sqrt(mean(m^2)
// + eps) per row}.
std::vector<at::Tensor> rms_norm_forward(const at::Tensor& m, const at::Tensor& weight,
                                         double eps) {
  const int64_t rows = m.size(0), width = m.size(1);
  auto out = at::empty_like(m), inv_rms = at::empty({rows}, m.options());
  const float *in = m.data_ptr<float>(), *w = weight.data_ptr<float>();
  float *o = out.data_ptr<float>(), *r = inv_rms.data_ptr<float>();
  for (int64_t t = 0; t < rows; ++t) {
    float sum = 0;
    for (int64_t j = 0; j < width; ++j) sum += in[t * width + j] * in[t * width + j];
    r[t] = 1.f / std::sqrt(sum / float(width) + float(eps));
    for (int64_t j = 0; j < width; ++j) o[t * width + j] = in[t * width + j] * r[t] * w[j];
  }
  return {out, inv_rms};
}

// Backward of rms_norm_forward: {grad_m, grad_weight}. With g = grad_out w and n = m r:
// grad_m = r (g - n mean(g n)); grad_weight = sum over rows of grad_out n.
std::vector<at::Tensor> rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& m,
                                          const at::Tensor& inv_rms, const at::Tensor& weight) {
  const int64_t rows = m.size(0), width = m.size(1);
  auto grad_m = at::empty_like(m), grad_weight = at::zeros_like(weight);
  const float *dy = grad_out.data_ptr<float>(), *in = m.data_ptr<float>();
  const float *r = inv_rms.data_ptr<float>(), *w = weight.data_ptr<float>();
  float *dm = grad_m.data_ptr<float>(), *dw = grad_weight.data_ptr<float>();
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = in + t * width;
    const float* dy_row = dy + t * width;
    float dot = 0;
    for (int64_t j = 0; j < width; ++j) {
      dot += dy_row[j] * w[j] * row[j] * r[t];
      dw[j] += dy_row[j] * row[j] * r[t];
    }
    const float mean = dot / float(width);
    for (int64_t j = 0; j < width; ++j) {
      dm[t * width + j] = r[t] * (dy_row[j] * w[j] - row[j] * r[t] * mean);
    }
  }
  return {grad_m, grad_weight};
}

// K3 Stable LatentMoE (ops/moe/fused.latent_moe_layer_fused; architecture.md 5.2): route and
// aux loss; z = x W_ld^T; m = routed experts of z; y = RMSNorm(m) W_lu^T (norm when norm_weight
// is non-empty); plus the shared GLU of x (one expert of width S f that every token takes with
// weight 1). Returns {out, aux_loss, scores, index, values, loads}, then the list the backward
// takes (see latent_moe_layer_backward_op).
std::vector<at::Tensor> latent_moe_layer_forward_op(
    const at::Tensor& x_any, const at::Tensor& router_weight, const at::Tensor& bias,
    const at::Tensor& latent_down, const at::Tensor& latent_up, const at::Tensor& norm_weight,
    const at::Tensor& w_gate_any, const at::Tensor& w_up_any, const at::Tensor& w_down_any,
    const at::Tensor& s_gate, const at::Tensor& s_up, const at::Tensor& s_down, int64_t top_k,
    int64_t count, double routed_scale, int64_t num_sequences, double alpha, double eps,
    int64_t kind, double beta, double linear_beta) {
  TORCH_CHECK(x_any.dim() == 2 && x_any.scalar_type() == at::kFloat,
              "latent_moe_layer: expected fp32 x [N, d]");
  const auto x = x_any.contiguous(), w_gate = w_gate_any.contiguous();
  const auto w_up = w_up_any.contiguous(), w_down = w_down_any.contiguous();
  const int64_t d = x.size(1), num_experts = w_gate.size(0);
  const auto routed =
      route_with_aux(x, router_weight, bias, top_k, count, routed_scale, num_sequences, alpha);
  const at::Tensor &scores = routed[0], &index = routed[2], &weights = routed[3];
  const auto z = linear_rows(x, latent_down);
  const auto slots = slot_assignments(index, weights, top_k, 0, 0);
  const auto plan = plan_dispatch_op(slots[0], num_experts);
  const auto experts = experts_forward_op(z, slots[1], plan[0], plan[1], plan[2], plan[3], w_gate,
                                          w_up, w_down, kind, beta, linear_beta);
  const auto& m = experts[0];
  auto normed = std::vector<at::Tensor>{m, at::empty({0}, x.options())};
  if (norm_weight.numel()) normed = rms_norm_forward(m, norm_weight.contiguous(), eps);
  auto out = linear_rows(normed[0], latent_up);
  // Shared GLU [S f, d] as a single expert [1, S f, d] (down [1, d, S f]), every token at weight 1.
  const auto shared_slots = slot_assignments(index, weights, 0, 1, 0);
  const auto shared_plan = plan_dispatch_op(shared_slots[0], 1);
  const auto shared_gate = s_gate.contiguous().view({1, -1, d});
  const auto shared_up = s_up.contiguous().view({1, -1, d});
  const auto shared_down = s_down.contiguous().view({1, d, -1});
  const auto shared = experts_forward_op(x, shared_slots[1], shared_plan[0], shared_plan[1],
                                         shared_plan[2], shared_plan[3], shared_gate, shared_up,
                                         shared_down, kind, beta, linear_beta);
  out.add_(shared[0]);
  return {out, routed[4], scores, index, routed[1], loads_of(plan[3], num_experts),
          // Saved for the backward, in latent_moe_layer_backward_op's order.
          weights, routed[5], z, slots[1], plan[0], plan[1], plan[2], plan[3], experts[1], w_gate,
          w_up, w_down, m, normed[0], normed[1], shared_slots[1], shared_plan[0], shared_plan[1],
          shared_plan[2], shared_plan[3], shared[1], shared_gate, shared_up, shared_down};
}

// Backward of latent_moe_layer_forward_op. `saved` is {x, router_weight, latent_down, latent_up,
// norm_weight, scores, index} followed by the forward's saved list. Returns {grad_x,
// grad_router, grad_latent_down, grad_latent_up, grad_norm_weight (empty when off), grad routed
// gate, up, down, grad shared gate, up, down}.
std::vector<at::Tensor> latent_moe_layer_backward_op(const at::Tensor& grad_out_any,
                                                     const at::Tensor& grad_aux,
                                                     const std::vector<at::Tensor>& saved,
                                                     double routed_scale, int64_t kind, double beta,
                                                     double linear_beta) {
  TORCH_CHECK(saved.size() == 31, "latent_moe_layer_backward: expected 31 saved tensors");
  const at::Tensor &x_any = saved[0], &router_weight = saved[1], &latent_down = saved[2];
  const at::Tensor &latent_up = saved[3], &norm_weight = saved[4], &scores = saved[5];
  const at::Tensor &index = saved[6], &weights = saved[7], &coefficient = saved[8];
  const at::Tensor &z = saved[9], &slot_weight = saved[10];
  const at::Tensor *plan = &saved[11], &pre = saved[15];
  const at::Tensor &w_gate = saved[16], &w_up = saved[17], &w_down = saved[18];
  const at::Tensor &m = saved[19], &normed = saved[20], &inv_rms = saved[21];
  const at::Tensor &shared_weight = saved[22], *shared_plan = &saved[23];
  const at::Tensor &shared_pre = saved[27], &shared_gate = saved[28];
  const at::Tensor &shared_up = saved[29], &shared_down = saved[30];
  const auto x = x_any.contiguous(), grad_out = grad_out_any.contiguous();
  const int64_t d = x.size(1);
  const int64_t num_tokens = x.size(0), top_k = weights.size(1);
  auto shared = experts_backward_op(grad_out, x, shared_weight, shared_plan[0], shared_plan[1],
                                    shared_plan[2], shared_plan[3], shared_gate, shared_up,
                                    shared_down, shared_pre, kind, beta, linear_beta);
  auto& grad_x = shared[0];
  auto grad_normed = at::empty_like(normed);
  auto grad_latent_up = linear_rows_backward(grad_out, normed, latent_up, grad_normed, false);
  auto grad_m = grad_normed, grad_norm_weight = at::empty({0}, x.options());
  if (norm_weight.numel()) {
    auto norm = rms_norm_backward(grad_normed, m, inv_rms, norm_weight.contiguous());
    grad_m = norm[0];
    grad_norm_weight = norm[1];
  }
  auto routed = experts_backward_op(grad_m, z, slot_weight, plan[0], plan[1], plan[2], plan[3],
                                    w_gate, w_up, w_down, pre, kind, beta, linear_beta);
  const auto& grad_z = routed[0];
  auto grad_latent_down = linear_rows_backward(grad_z, x, latent_down, grad_x, true);
  auto grad_router =
      route_with_aux_backward(routed[1].view({num_tokens, top_k}), grad_aux, coefficient, scores,
                              index, weights, routed_scale, x, router_weight, grad_x);
  return {grad_x,
          grad_router,
          grad_latent_down,
          grad_latent_up,
          grad_norm_weight,
          routed[2],
          routed[3],
          routed[4],
          shared[2].view({-1, d}),
          shared[3].view({-1, d}),
          shared[4].view({d, -1})};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("select_top", &select_top_op);
  m.def("plan_dispatch", &plan_dispatch_op);
  m.def("route_forward", &route_forward_op);
  m.def("margin_counts", &margin_counts_op);
  m.def("route_backward", &route_backward_op);
  m.def("sequence_aux_forward", &sequence_aux_forward_op);
  m.def("sequence_aux_backward", &sequence_aux_backward_op);
  m.def("softmax_xent_grad", &softmax_xent_grad_op);
  m.def("conv_silu_forward", &conv_silu_forward_op);
  m.def("conv_silu_backward", &conv_silu_backward_op);
  m.def("linear_rows", &linear_rows);
  m.def("linear_rows_backward", &linear_rows_backward);
  m.def("glu_forward", &glu_forward_op);
  m.def("glu_backward", &glu_backward_op);
  m.def("experts_forward", &experts_forward_op);
  m.def("experts_backward", &experts_backward_op);
  m.def("moe_layer_forward", &moe_layer_forward_op);
  m.def("moe_layer_backward", &moe_layer_backward_op);
  m.def("latent_moe_layer_forward", &latent_moe_layer_forward_op);
  m.def("latent_moe_layer_backward", &latent_moe_layer_backward_op);
}
