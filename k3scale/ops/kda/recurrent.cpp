// Python side: recurrent.py; references: naive.py (the recurrence) and chunk.py (chunked torch).

#include "../cpu/common.h"
#include "../cpu/ops.h"

// KDA as its token recurrence, one (sequence, head) at a time, with the state in cache.
// Per head, S [K, V] key-major, a = exp(g_t):
//   S' = Diag(a) S,  r = v_t - S'^T k_t,  S_t = S' + beta_t k_t r^T,  o_t = S_t^T (scale q_t).
// At the study ladders' head widths (K = V = 4-16) this is a few hundred FLOPs per token and
// head, against the chunked form's C x C score matrices (C = 64) that stream through memory.
//
// The backward runs the recurrence in reverse. States are not stored per token: the forward keeps
// the state entering every `segment`-th token, and the backward recomputes one segment's states
// (and residuals r) into a buffer before walking it backwards, so memory is T / segment states
// per head plus one segment's worth.

namespace {

// out[0:n] = exp(x[0:n]), vectorised (a scalar exp per channel cost as much as the state update).
template <typename T>
void exp_into(const T* x, T* out, int64_t n) {
  using V = Vec<T>;
  for (int64_t j = 0; j < n; j += V::size()) {
    const int64_t count = std::min<int64_t>(V::size(), n - j);
    const V value = load(x + j, count);
    // fp64 keeps Sleef's 1-ulp exp so fp64 tests stay at fp64 accuracy.
    if constexpr (std::is_same_v<T, double>) {
      store(value.exp(), out + j, count);
    } else {
      store(value.exp_u20(), out + j, count);
    }
  }
}

// Strided views of one (sequence, head): row t of q/k/g is `base + t * stride`.
struct Layout {
  int64_t seq_len, heads, d_key, d_value;
  int64_t key_offset(int64_t b, int64_t h, int64_t t) const {
    return ((b * seq_len + t) * heads + h) * d_key;
  }
  int64_t value_offset(int64_t b, int64_t h, int64_t t) const {
    return ((b * seq_len + t) * heads + h) * d_value;
  }
  int64_t beta_offset(int64_t b, int64_t h, int64_t t) const { return (b * seq_len + t) * heads + h; }
};

// One token forward on state S [K, V] in place, given a = exp(g_t) [K]; writes r [V] (the
// residual) and, when `out` is set, o [V].
template <typename T>
void step_forward(T* S, const T* q, const T* k, const T* v, const T* a, T beta, T scale, T* r,
                  T* out, const Layout& L) {
  using Vc = Vec<T>;
  const int64_t K = L.d_key, V = L.d_value;
  for (int64_t c = 0; c < V; c += Vc::size()) {
    const int64_t count = std::min<int64_t>(Vc::size(), V - c);
    // Pass 1: rows decay in place, r accumulates S'^T k; then r = v - S'^T k.
    Vc acc(T(0));
    for (int64_t i = 0; i < K; ++i) {
      T* row = S + i * V + c;
      const Vc decayed = Vc(a[i]) * load(row, count);
      store(decayed, row, count);
      acc = at::vec::fmadd(Vc(k[i]), decayed, acc);
    }
    const Vc residual = load(v + c, count) - acc;
    store(residual, r + c, count);
    // Pass 2: S_t = S' + beta k r^T; o = S_t^T (scale q).
    Vc o(T(0));
    for (int64_t i = 0; i < K; ++i) {
      T* row = S + i * V + c;
      const Vc updated = at::vec::fmadd(Vc(beta * k[i]), residual, load(row, count));
      store(updated, row, count);
      o = at::vec::fmadd(Vc(scale * q[i]), updated, o);
    }
    if (out) store(o, out + c, count);
  }
}

}  // namespace

// q, k, g [B, T, H, K], v [B, T, H, V], beta [B, T, H], initial [B, H, K, V]; contiguous, one
// floating type. Returns {o [B, T, H, V], final state [B, H, K, V], checkpoints [B, H, n, K, V]}
// with checkpoint s the state entering token s * segment.
std::vector<at::Tensor> kda_recurrent_forward_op(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const at::Tensor& g,
                                                 const at::Tensor& beta,
                                                 const at::Tensor& initial, double scale,
                                                 int64_t segment) {
  TORCH_CHECK(q.dim() == 4 && q.is_contiguous() && k.is_contiguous() && v.is_contiguous() &&
                  g.is_contiguous() && beta.is_contiguous() && initial.is_contiguous() &&
                  segment >= 1,
              "kda_recurrent_forward: expected contiguous [B, T, H, K] inputs and segment >= 1");
  const Layout L{q.size(1), q.size(2), q.size(3), v.size(3)};
  const int64_t batch = q.size(0), num_segments = (L.seq_len + segment - 1) / segment;
  const int64_t state_size = L.d_key * L.d_value;
  auto out = at::empty(v.sizes(), v.options());
  auto final_state = initial.clone();
  auto checkpoints = at::empty({batch, L.heads, num_segments, L.d_key, L.d_value}, v.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "kda_recurrent_forward", [&] {
    using T = scalar_t;
    const T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
    const T *gp = g.data_ptr<T>(), *bp = beta.data_ptr<T>();
    T *op = out.data_ptr<T>(), *states = final_state.data_ptr<T>();
    T* saved = checkpoints.data_ptr<T>();
    std::vector<T> r(L.d_value), a(L.d_key);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < L.heads; ++h) {
        T* S = states + (b * L.heads + h) * state_size;
        T* saved_bh = saved + (b * L.heads + h) * num_segments * state_size;
        for (int64_t t = 0; t < L.seq_len; ++t) {
          if (t % segment == 0) std::copy(S, S + state_size, saved_bh + (t / segment) * state_size);
          const int64_t key = L.key_offset(b, h, t), value = L.value_offset(b, h, t);
          exp_into(gp + key, a.data(), L.d_key);
          step_forward<T>(S, qp + key, kp + key, vp + value, a.data(), bp[L.beta_offset(b, h, t)],
                          T(scale), r.data(), op + value, L);
        }
      }
    }
  });
  return {out, final_state, checkpoints};
}

// Backward of kda_recurrent_forward_op. grad_final [B, H, K, V] (zeros when the final state was
// not used). Returns {dq, dk, dv, dg, dbeta, d_initial}, derived in recurrent.py's docstring.
std::vector<at::Tensor> kda_recurrent_backward_op(const at::Tensor& grad_out_any,
                                                  const at::Tensor& grad_final,
                                                  const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, const at::Tensor& g,
                                                  const at::Tensor& beta,
                                                  const at::Tensor& checkpoints, double scale,
                                                  int64_t segment) {
  const auto grad_out = grad_out_any.contiguous();
  TORCH_CHECK(grad_out.sizes() == v.sizes() && grad_final.is_contiguous(),
              "kda_recurrent_backward: grad_out must match the output");
  const Layout L{q.size(1), q.size(2), q.size(3), v.size(3)};
  const int64_t batch = q.size(0), num_segments = checkpoints.size(2);
  const int64_t K = L.d_key, V = L.d_value, state_size = K * V;
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  auto dg = at::empty_like(g), dbeta = at::empty_like(beta);
  auto d_state = grad_final.clone();
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "kda_recurrent_backward", [&] {
    using T = scalar_t;
    const T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
    const T *gp = g.data_ptr<T>(), *bp = beta.data_ptr<T>(), *dop = grad_out.data_ptr<T>();
    const T* saved = checkpoints.data_ptr<T>();
    T *dqp = dq.data_ptr<T>(), *dkp = dk.data_ptr<T>(), *dvp = dv.data_ptr<T>();
    T *dgp = dg.data_ptr<T>(), *dbp = dbeta.data_ptr<T>(), *d_states = d_state.data_ptr<T>();
    // entering[j]: state entering token j of the segment; residual[j]: its r.
    // decay[j]: exp(g) of token j of the segment.
    std::vector<T> entering((segment + 1) * state_size), residual(segment * V), decay(segment * K);
    std::vector<T> dr(V), row_grad(K);
    const T s = T(scale);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < L.heads; ++h) {
        T* dS = d_states + (b * L.heads + h) * state_size;
        const T* saved_bh = saved + (b * L.heads + h) * num_segments * state_size;
        for (int64_t seg = num_segments - 1; seg >= 0; --seg) {
          const int64_t start = seg * segment, stop = std::min(L.seq_len, start + segment);
          std::copy(saved_bh + seg * state_size, saved_bh + (seg + 1) * state_size,
                    entering.begin());
          for (int64_t t = start; t < stop; ++t) {
            T* next = entering.data() + (t - start + 1) * state_size;
            std::copy(next - state_size, next, next);
            const int64_t key = L.key_offset(b, h, t), value = L.value_offset(b, h, t);
            T* a = decay.data() + (t - start) * K;
            exp_into(gp + key, a, K);
            step_forward<T>(next, qp + key, kp + key, vp + value, a, bp[L.beta_offset(b, h, t)],
                            s, residual.data() + (t - start) * V, nullptr, L);
          }
          for (int64_t t = stop - 1; t >= start; --t) {
            const int64_t key = L.key_offset(b, h, t), value = L.value_offset(b, h, t);
            const T *qt = qp + key, *kt = kp + key, *dot_ = dop + value;
            const T* at = decay.data() + (t - start) * K;
            const T bt = bp[L.beta_offset(b, h, t)];
            const T* previous = entering.data() + (t - start) * state_size;
            const T* r = residual.data() + (t - start) * V;
            // Pass 1, per row i: dS_i += s q_i do (now dL/dS_t); dq_i = s S_t,i . do with
            // S_t,i = a_i S_prev,i + beta k_i r; u_i = dS_i . r; dr = dS^T k.
            using Vc = Vec<T>;
            std::fill(dr.begin(), dr.end(), T(0));
            T d_beta = T(0);
            for (int64_t i = 0; i < K; ++i) {
              T* dS_i = dS + i * V;
              const T* prev_i = previous + i * V;
              Vc acc_q(T(0)), acc_u(T(0));
              for (int64_t c = 0; c < V; c += Vc::size()) {
                const int64_t count = std::min<int64_t>(Vc::size(), V - c);
                const Vc d_out = load(dot_ + c, count), r_c = load(r + c, count);
                const Vc grad = at::vec::fmadd(Vc(s * qt[i]), d_out, load(dS_i + c, count));
                store(grad, dS_i + c, count);
                const Vc state = at::vec::fmadd(Vc(bt * kt[i]), r_c,
                                                Vc(at[i]) * load(prev_i + c, count));
                acc_q = at::vec::fmadd(state, d_out, acc_q);
                acc_u = at::vec::fmadd(grad, r_c, acc_u);
                store(at::vec::fmadd(Vc(kt[i]), grad, load(dr.data() + c, count)),
                      dr.data() + c, count);
              }
              dqp[key + i] = s * reduce_sum(acc_q);
              row_grad[i] = reduce_sum(acc_u);
              d_beta += kt[i] * row_grad[i];
            }
            dbp[L.beta_offset(b, h, t)] = d_beta;
            for (int64_t j = 0; j < V; ++j) dr[j] *= bt;
            std::copy(dr.begin(), dr.end(), dvp + value);
            // Pass 2, per row i: dS'_i = dS_i - k_i dr; dk_i = beta u_i - S'_i . dr;
            // dg_i = dS'_i . S'_i; dS_prev,i = a_i dS'_i.
            for (int64_t i = 0; i < K; ++i) {
              T* dS_i = dS + i * V;
              const T* prev_i = previous + i * V;
              Vc acc_k(T(0)), acc_g(T(0));
              for (int64_t c = 0; c < V; c += Vc::size()) {
                const int64_t count = std::min<int64_t>(Vc::size(), V - c);
                const Vc dr_c = load(dr.data() + c, count);
                const Vc decayed = Vc(at[i]) * load(prev_i + c, count);
                const Vc grad = at::vec::fmadd(Vc(-kt[i]), dr_c, load(dS_i + c, count));
                acc_k = at::vec::fmadd(decayed, dr_c, acc_k);
                acc_g = at::vec::fmadd(grad, decayed, acc_g);
                store(Vc(at[i]) * grad, dS_i + c, count);
              }
              dkp[key + i] = bt * row_grad[i] - reduce_sum(acc_k);
              dgp[key + i] = reduce_sum(acc_g);
            }
          }
        }
      }
    }
  });
  return {dq, dk, dv, dg, dbeta, d_state};
}
