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
T reduce_sum(const Vec<T>& x) {
  return at::vec::vec_reduce_all<T>([](Vec<T> a, Vec<T> b) { return a + b; }, x);
}

template <typename T>
T reduce_max(const Vec<T>& x) {
  return at::vec::vec_reduce_all<T>([](Vec<T> a, Vec<T> b) { return at::vec::maximum(a, b); }, x);
}

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

// s[0:n] = scale * sum_d q[d] * keys_t[d, 0:n]; returns max(s[0:n]).
template <typename T>
T scores(const T* q, const T* keys_t, int64_t steps, int64_t width, int64_t n, T scale, T* s) {
  using V = Vec<T>;
  V best(-std::numeric_limits<T>::infinity());
  for (int64_t j = 0; j < n; j += V::size()) {
    const int64_t count = std::min<int64_t>(V::size(), n - j);
    V acc(T(0));
    for (int64_t d = 0; d < width; ++d) {
      acc = at::vec::fmadd(V(q[d]), load(keys_t + d * steps + j, count), acc);
    }
    acc = acc * V(scale);
    store(acc, s + j, count);
    const V masked = count == V::size()
                         ? acc
                         : V::set(V(-std::numeric_limits<T>::infinity()), acc, count);
    best = at::vec::maximum(best, masked);
  }
  return reduce_max(best);
}

}  // namespace

// Returns {o [B, T, H, Dv], lse [B, H, T]}.
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
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "causal_attention_forward", [&] {
    using T = scalar_t;
    using V = Vec<T>;
    const T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
    T *op = out.data_ptr<T>(), *lp = lse.data_ptr<T>();
    std::vector<T> keys_t(dk * steps), values_t(dv * steps), s(steps);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base_k = (b * steps * heads + h) * dk, base_v = (b * steps * heads + h) * dv;
        transpose_into(kp + base_k, heads * dk, steps, dk, keys_t.data());
        transpose_into(vp + base_v, heads * dv, steps, dv, values_t.data());
        for (int64_t i = 0; i < steps; ++i) {
          const int64_t n = i + 1;
          const T best = scores(qp + base_k + i * heads * dk, keys_t.data(), steps, dk, n,
                                T(scale), s.data());
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
          for (int64_t d = 0; d < dv; ++d) {
            V acc(T(0));
            const T* vt = values_t.data() + d * steps;
            for (int64_t j = 0; j < n; j += V::size()) {
              const int64_t count = std::min<int64_t>(V::size(), n - j);
              acc = at::vec::fmadd(load(s.data() + j, count), load(vt + j, count), acc);
            }
            o[d] = reduce_sum(acc) / sum;
          }
          lp[(b * heads + h) * steps + i] = best + std::log(sum);
        }
      }
    }
  });
  return {out, lse};
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
    std::vector<T> dvalues_t(dv * steps), p(steps), ds(steps);
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
          scores(qi, keys_t.data(), steps, dk, n, sc, p.data());
          const T lse_i = lp[(b * heads + h) * steps + i];
          T delta = T(0);
          for (int64_t d = 0; d < dv; ++d) delta += doi[d] * oi[d];
          for (int64_t j = 0; j < n; j += V::size()) {
            const int64_t count = std::min<int64_t>(V::size(), n - j);
            const V prob = vexp(load(p.data() + j, count) - V(lse_i));
            store(prob, p.data() + j, count);
            V dp(T(0));
            for (int64_t d = 0; d < dv; ++d) {
              dp = at::vec::fmadd(V(doi[d]), load(values_t.data() + d * steps + j, count), dp);
              // dv_j += p_ij do_i
              T* dvt = dvalues_t.data() + d * steps + j;
              store(at::vec::fmadd(V(doi[d]), prob, load(dvt, count)), dvt, count);
            }
            store(prob * (dp - V(delta)) * V(sc), ds.data() + j, count);
          }
          T* dqi = dqp + base_k + i * heads * dk;
          for (int64_t d = 0; d < dk; ++d) {
            V acc(T(0));
            T* dkt = dkeys_t.data() + d * steps;
            const T* kt = keys_t.data() + d * steps;
            for (int64_t j = 0; j < n; j += V::size()) {
              const int64_t count = std::min<int64_t>(V::size(), n - j);
              const V dsv = load(ds.data() + j, count);
              acc = at::vec::fmadd(dsv, load(kt + j, count), acc);
              store(at::vec::fmadd(V(qi[d]), dsv, load(dkt + j, count)), dkt + j, count);
            }
            dqi[d] = reduce_sum(acc);
          }
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
