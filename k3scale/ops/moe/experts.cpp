// Routed experts (architecture.md section 5) on assignments sorted by expert (a counting
// sort, plan_dispatch_op): per expert, tiles of up to kTile tokens are read in place (token rows
// by index, no gather copies) and every projection is a small register-blocked GEMM; activation
// and routing weight are applied in the same pass. Weight gradients reduce over an expert's
// tokens in sorted order, so results are deterministic. Python side: fused.py; references:
// naive.py and dispatch.py.

#include "../cpu/common.h"
#include "../cpu/ops.h"
#include "../situ/glu.h"

namespace {

// Tokens per expert tile: its [kTile, f] buffers stay in L1/L2 at the study widths.
constexpr int64_t kTile = 128;

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
