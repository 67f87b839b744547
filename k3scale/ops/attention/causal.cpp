// Python side: causal.py; reference: torch's scaled_dot_product_attention (math path).

#include <limits>

#include "../cpu/common.h"
#include "../cpu/ops.h"

// Causal softmax attention for the study ladders' narrow heads (widths 4-16), one (sequence,
// head) at a time with its keys and values transposed in cache, vectorised across key positions:
// torch's CPU flash kernel works in GEMM tiles whose inner dimension is the head width, which at
// 8-16 leaves its matrix units mostly idle.
//   q, k [B, T, H, Dk], v [B, T, H, Dv] (the projections' layout), scale.
//   s_ij = scale q_i . k_j (j <= i), p = softmax_j(s), o_i = sum_j p_ij v_j.
// The forward keeps lse_i = logsumexp_j s_ij; the backward recomputes p from it (flash style):
//   dp_ij = do_i . v_j, ds_ij = p_ij (dp_ij - do_i . o_i),
//   dq_i = scale sum_j ds_ij k_j, dk_j = scale sum_i ds_ij q_i, dv_j = sum_i p_ij do_i.

namespace {

template <typename T>
Vec<T> vexp(const Vec<T>& x) {
  if constexpr (std::is_same_v<T, double>) {
    return x.exp();
  } else {
    return x.exp_u20();
  }
}

// rows [T, D] with row stride `stride` -> out [D, T].
template <typename T>
void transpose_into(const T* rows, int64_t stride, int64_t steps, int64_t width, T* out) {
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t d = 0; d < width; ++d) out[d * steps + t] = rows[t * stride + d];
  }
}

// s[0:n] = scale * sum_d q[d] * keys_t[d, 0:n]; returns max(s[0:n]). Four blocks of key
// positions at a time: each block's sum over d is a chain of dependent FMAs, so one block alone
// waits on the FMA latency; four independent chains keep the units busy. Every output keeps
// its summation order (d = 0, 1, ...), so the result is bitwise that of one block at a time.
template <typename T>
T scores(const T* q, const T* keys_t, int64_t steps, int64_t width, int64_t n, T scale, T* s) {
  using V = Vec<T>;
  constexpr int64_t L = V::size();
  V best(-std::numeric_limits<T>::infinity());
  int64_t j = 0;
  for (; j + 4 * L <= n; j += 4 * L) {
    V a0(T(0)), a1(T(0)), a2(T(0)), a3(T(0));
    for (int64_t d = 0; d < width; ++d) {
      const V qd(q[d]);
      const T* kt = keys_t + d * steps + j;
      a0 = at::vec::fmadd(qd, V::loadu(kt), a0);
      a1 = at::vec::fmadd(qd, V::loadu(kt + L), a1);
      a2 = at::vec::fmadd(qd, V::loadu(kt + 2 * L), a2);
      a3 = at::vec::fmadd(qd, V::loadu(kt + 3 * L), a3);
    }
    a0 = a0 * V(scale), a1 = a1 * V(scale), a2 = a2 * V(scale), a3 = a3 * V(scale);
    a0.store(s + j), a1.store(s + j + L), a2.store(s + j + 2 * L), a3.store(s + j + 3 * L);
    best = at::vec::maximum(best, at::vec::maximum(at::vec::maximum(a0, a1),
                                                   at::vec::maximum(a2, a3)));
  }
  for (; j < n; j += L) {
    const int64_t count = std::min<int64_t>(L, n - j);
    V acc(T(0));
    for (int64_t d = 0; d < width; ++d) {
      acc = at::vec::fmadd(V(q[d]), load(keys_t + d * steps + j, count), acc);
    }
    acc = acc * V(scale);
    store(acc, s + j, count);
    const V masked =
        count == L ? acc : V::set(V(-std::numeric_limits<T>::infinity()), acc, count);
    best = at::vec::maximum(best, masked);
  }
  return reduce_max(best);
}

// out[d] = sum_j w[j] * rows_t[d, j] over j < n, for d < width (rows_t [width, steps]); four
// rows at a time for the same reason as `scores`, each output in its own order (j ascending).
template <typename T>
void weighted_rows(const T* w, const T* rows_t, int64_t steps, int64_t width, int64_t n, T* out) {
  using V = Vec<T>;
  constexpr int64_t L = V::size();
  int64_t d = 0;
  for (; d + 4 <= width; d += 4) {
    V a0(T(0)), a1(T(0)), a2(T(0)), a3(T(0));
    const T* r = rows_t + d * steps;
    for (int64_t j = 0; j < n; j += L) {
      const int64_t count = std::min<int64_t>(L, n - j);
      const V wj = load(w + j, count);
      a0 = at::vec::fmadd(wj, load(r + j, count), a0);
      a1 = at::vec::fmadd(wj, load(r + steps + j, count), a1);
      a2 = at::vec::fmadd(wj, load(r + 2 * steps + j, count), a2);
      a3 = at::vec::fmadd(wj, load(r + 3 * steps + j, count), a3);
    }
    out[d] = reduce_sum(a0), out[d + 1] = reduce_sum(a1);
    out[d + 2] = reduce_sum(a2), out[d + 3] = reduce_sum(a3);
  }
  for (; d < width; ++d) {
    V acc(T(0));
    for (int64_t j = 0; j < n; j += L) {
      const int64_t count = std::min<int64_t>(L, n - j);
      acc = at::vec::fmadd(load(w + j, count), load(rows_t + d * steps + j, count), acc);
    }
    out[d] = reduce_sum(acc);
  }
}

// From a row's logits s[0:n] and its lse: p_j = exp(s_j - lse), ds_j = scale p_j (dp_j - delta)
// with dp_j = do . v_j, and dvalues_t[d, j] += do[d] p_j. Four blocks of key positions at a
// time (independent FMA chains over d, as in `scores`); each sum keeps its order.
template <typename T>
void probs_and_dscores(const T* s, T lse, const T* grad_o, const T* values_t, T* dvalues_t,
                       int64_t steps, int64_t width, int64_t n, T delta, T scale, T* ds) {
  using V = Vec<T>;
  constexpr int64_t L = V::size();
  int64_t j = 0;
  for (; j + 4 * L <= n; j += 4 * L) {
    const V p0 = vexp(V::loadu(s + j) - V(lse)), p1 = vexp(V::loadu(s + j + L) - V(lse));
    const V p2 = vexp(V::loadu(s + j + 2 * L) - V(lse));
    const V p3 = vexp(V::loadu(s + j + 3 * L) - V(lse));
    V dp0(T(0)), dp1(T(0)), dp2(T(0)), dp3(T(0));
    for (int64_t d = 0; d < width; ++d) {
      const V g(grad_o[d]);
      const T* vt = values_t + d * steps + j;
      T* dvt = dvalues_t + d * steps + j;
      dp0 = at::vec::fmadd(g, V::loadu(vt), dp0);
      dp1 = at::vec::fmadd(g, V::loadu(vt + L), dp1);
      dp2 = at::vec::fmadd(g, V::loadu(vt + 2 * L), dp2);
      dp3 = at::vec::fmadd(g, V::loadu(vt + 3 * L), dp3);
      at::vec::fmadd(g, p0, V::loadu(dvt)).store(dvt);
      at::vec::fmadd(g, p1, V::loadu(dvt + L)).store(dvt + L);
      at::vec::fmadd(g, p2, V::loadu(dvt + 2 * L)).store(dvt + 2 * L);
      at::vec::fmadd(g, p3, V::loadu(dvt + 3 * L)).store(dvt + 3 * L);
    }
    (p0 * (dp0 - V(delta)) * V(scale)).store(ds + j);
    (p1 * (dp1 - V(delta)) * V(scale)).store(ds + j + L);
    (p2 * (dp2 - V(delta)) * V(scale)).store(ds + j + 2 * L);
    (p3 * (dp3 - V(delta)) * V(scale)).store(ds + j + 3 * L);
  }
  for (; j < n; j += L) {
    const int64_t count = std::min<int64_t>(L, n - j);
    const V prob = vexp(load(s + j, count) - V(lse));
    V dp(T(0));
    for (int64_t d = 0; d < width; ++d) {
      dp = at::vec::fmadd(V(grad_o[d]), load(values_t + d * steps + j, count), dp);
      T* dvt = dvalues_t + d * steps + j;
      store(at::vec::fmadd(V(grad_o[d]), prob, load(dvt, count)), dvt, count);
    }
    store(prob * (dp - V(delta)) * V(scale), ds + j, count);
  }
}

// dq[d] = sum_j ds[j] keys_t[d, j] and dkeys_t[d, j] += qi[d] ds[j] over j < n, four d at a time
// (independent FMA chains, as in `scores`); each sum keeps its order (j ascending). dq alone is
// `weighted_rows(ds, keys_t, ...)`; fusing the dK update into the same pass over ds made the
// backward 7% faster at k2-s3's shapes than that plus a separate dK loop (bitwise the same).
template <typename T>
void dq_and_dkeys(const T* ds, const T* qi, const T* keys_t, T* dkeys_t, int64_t steps,
                  int64_t width, int64_t n, T* dq) {
  using V = Vec<T>;
  constexpr int64_t L = V::size();
  int64_t d = 0;
  for (; d + 4 <= width; d += 4) {
    V a0(T(0)), a1(T(0)), a2(T(0)), a3(T(0));
    const V q0(qi[d]), q1(qi[d + 1]), q2(qi[d + 2]), q3(qi[d + 3]);
    const T* kt = keys_t + d * steps;
    T* dkt = dkeys_t + d * steps;
    for (int64_t j = 0; j < n; j += L) {
      const int64_t count = std::min<int64_t>(L, n - j);
      const V dsv = load(ds + j, count);
      a0 = at::vec::fmadd(dsv, load(kt + j, count), a0);
      a1 = at::vec::fmadd(dsv, load(kt + steps + j, count), a1);
      a2 = at::vec::fmadd(dsv, load(kt + 2 * steps + j, count), a2);
      a3 = at::vec::fmadd(dsv, load(kt + 3 * steps + j, count), a3);
      store(at::vec::fmadd(q0, dsv, load(dkt + j, count)), dkt + j, count);
      store(at::vec::fmadd(q1, dsv, load(dkt + steps + j, count)), dkt + steps + j, count);
      store(at::vec::fmadd(q2, dsv, load(dkt + 2 * steps + j, count)), dkt + 2 * steps + j,
            count);
      store(at::vec::fmadd(q3, dsv, load(dkt + 3 * steps + j, count)), dkt + 3 * steps + j,
            count);
    }
    dq[d] = reduce_sum(a0), dq[d + 1] = reduce_sum(a1);
    dq[d + 2] = reduce_sum(a2), dq[d + 3] = reduce_sum(a3);
  }
  for (; d < width; ++d) {
    V acc(T(0));
    T* dkt = dkeys_t + d * steps;
    const T* kt = keys_t + d * steps;
    for (int64_t j = 0; j < n; j += L) {
      const int64_t count = std::min<int64_t>(L, n - j);
      const V dsv = load(ds + j, count);
      acc = at::vec::fmadd(dsv, load(kt + j, count), acc);
      store(at::vec::fmadd(V(qi[d]), dsv, load(dkt + j, count)), dkt + j, count);
    }
    dq[d] = reduce_sum(acc);
  }
}

}  // namespace

// Returns {o [B, T, H, Dv], lse [B, H, T], head_max [B, H]}: head_max is the largest logit
// s_ij (j <= i) of each sequence and head, what QK-Clip tracks (the forward has it anyway).
std::vector<at::Tensor> causal_attention_forward_op(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, double scale) {
  TORCH_CHECK(q.dim() == 4 && q.is_contiguous() && k.is_contiguous() && v.is_contiguous() &&
                  k.sizes() == q.sizes() && v.size(0) == q.size(0) && v.size(1) == q.size(1) &&
                  v.size(2) == q.size(2) && q.scalar_type() == k.scalar_type() &&
                  q.scalar_type() == v.scalar_type(),
              "causal_attention: expected contiguous q, k [B, T, H, Dk] and v [B, T, H, Dv]");
  const int64_t batch = q.size(0), steps = q.size(1), heads = q.size(2);
  const int64_t dk = q.size(3), dv = v.size(3);
  auto out = at::empty_like(v);
  auto lse = at::empty({batch, heads, steps}, q.options());
  auto head_max = at::empty({batch, heads}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "causal_attention_forward", [&] {
    using T = scalar_t;
    using V = Vec<T>;
    const T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
    T *op = out.data_ptr<T>(), *lp = lse.data_ptr<T>(), *mp = head_max.data_ptr<T>();
    std::vector<T> keys_t(dk * steps), values_t(dv * steps), s(steps), o_row(dv);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base_k = (b * steps * heads + h) * dk, base_v = (b * steps * heads + h) * dv;
        transpose_into(kp + base_k, heads * dk, steps, dk, keys_t.data());
        transpose_into(vp + base_v, heads * dv, steps, dv, values_t.data());
        T largest = -std::numeric_limits<T>::infinity();
        for (int64_t i = 0; i < steps; ++i) {
          const int64_t n = i + 1;
          const T best = scores(qp + base_k + i * heads * dk, keys_t.data(), steps, dk, n,
                                T(scale), s.data());
          largest = std::max(largest, best);
          V total(T(0));
          for (int64_t j = 0; j < n; j += V::size()) {
            const int64_t count = std::min<int64_t>(V::size(), n - j);
            const V e = vexp(load(s.data() + j, count) - V(best));
            store(e, s.data() + j, count);
            total = total + (count == V::size() ? e : V::set(V(T(0)), e, count));
          }
          const T sum = reduce_sum(total);
          // o[d] = sum_j p_j v_j[d] / sum, across key positions against the transposed values.
          T* o = op + base_v + i * heads * dv;
          weighted_rows(s.data(), values_t.data(), steps, dv, n, o_row.data());
          for (int64_t d = 0; d < dv; ++d) o[d] = o_row[d] / sum;
          lp[(b * heads + h) * steps + i] = best + std::log(sum);
        }
        mp[b * heads + h] = largest;
      }
    }
  });
  return {out, lse, head_max};
}

// Returns {dq, dk, dv} in the inputs' layouts.
std::vector<at::Tensor> causal_attention_backward_op(const at::Tensor& grad_out_any,
                                                     const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, const at::Tensor& out,
                                                     const at::Tensor& lse, double scale) {
  const auto grad_out = grad_out_any.contiguous();
  TORCH_CHECK(grad_out.sizes() == out.sizes(), "causal_attention_backward: grad_out shape");
  const int64_t batch = q.size(0), steps = q.size(1), heads = q.size(2);
  const int64_t dk = q.size(3), dv = v.size(3);
  auto dq = at::empty_like(q), dk_out = at::empty_like(k), dv_out = at::empty_like(v);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "causal_attention_backward", [&] {
    using T = scalar_t;
    using V = Vec<T>;
    const T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
    const T *op = out.data_ptr<T>(), *lp = lse.data_ptr<T>(), *gp = grad_out.data_ptr<T>();
    T *dqp = dq.data_ptr<T>(), *dkp = dk_out.data_ptr<T>(), *dvp = dv_out.data_ptr<T>();
    std::vector<T> keys_t(dk * steps), values_t(dv * steps), dkeys_t(dk * steps);
    std::vector<T> dvalues_t(dv * steps), s_row(steps), ds(steps);
    const T sc = T(scale);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base_k = (b * steps * heads + h) * dk, base_v = (b * steps * heads + h) * dv;
        transpose_into(kp + base_k, heads * dk, steps, dk, keys_t.data());
        transpose_into(vp + base_v, heads * dv, steps, dv, values_t.data());
        std::fill(dkeys_t.begin(), dkeys_t.end(), T(0));
        std::fill(dvalues_t.begin(), dvalues_t.end(), T(0));
        for (int64_t i = 0; i < steps; ++i) {
          const int64_t n = i + 1;
          const T* qi = qp + base_k + i * heads * dk;
          const T* doi = gp + base_v + i * heads * dv;
          const T* oi = op + base_v + i * heads * dv;
          scores(qi, keys_t.data(), steps, dk, n, sc, s_row.data());
          const T lse_i = lp[(b * heads + h) * steps + i];
          T delta = T(0);
          for (int64_t d = 0; d < dv; ++d) delta += doi[d] * oi[d];
          probs_and_dscores(s_row.data(), lse_i, doi, values_t.data(), dvalues_t.data(), steps,
                            dv, n, delta, sc, ds.data());
          dq_and_dkeys(ds.data(), qi, keys_t.data(), dkeys_t.data(), steps, dk, n,
                       dqp + base_k + i * heads * dk);
        }
        for (int64_t t = 0; t < steps; ++t) {
          for (int64_t d = 0; d < dk; ++d) dkp[base_k + t * heads * dk + d] = dkeys_t[d * steps + t];
          for (int64_t d = 0; d < dv; ++d) dvp[base_v + t * heads * dv + d] = dvalues_t[d * steps + t];
        }
      }
    }
  });
  return {dq, dk_out, dv_out};
}
