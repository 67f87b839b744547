// Python side: fused.py; torch reference: models/attnres.py.

#include <limits>

#include "../cpu/common.h"
#include "../cpu/ops.h"

// Attention Residuals over depth, one token row at a time with its N source rows in cache.
// Per row, with sources V_j [d] and u = query * key_norm_weight [d]:
//   r_j = (mean(V_j^2) + eps)^-1/2,  z_j = V_j . u,  s_j = r_j z_j,  p = softmax_j(s),
//   out = sum_j p_j V_j.
// The torch path stacks the sources into [N, B, T, d] and runs about ten elementwise passes over
// it forward and as many backward; here each source row is read twice forward and three times
// backward.

namespace {

template <typename T>
T dot(const T* a, const T* b, int64_t n) {
  using V = Vec<T>;
  V acc(T(0));
  for (int64_t j = 0; j < n; j += V::size()) {
    const int64_t count = std::min<int64_t>(V::size(), n - j);
    acc = at::vec::fmadd(load(a + j, count), load(b + j, count), acc);
  }
  return reduce_sum(acc);
}

// y[0:n] += alpha * x[0:n]
template <typename T>
void add_scaled(T alpha, const T* x, T* y, int64_t n) {
  using V = Vec<T>;
  for (int64_t j = 0; j < n; j += V::size()) {
    const int64_t count = std::min<int64_t>(V::size(), n - j);
    store(at::vec::fmadd(V(alpha), load(x + j, count), load(y + j, count)), y + j, count);
  }
}

template <typename T>
std::vector<const T*> pointers(const std::vector<at::Tensor>& tensors) {
  std::vector<const T*> out;
  for (const auto& t : tensors) out.push_back(t.data_ptr<T>());
  return out;
}

void check_sources(const std::vector<at::Tensor>& sources, const at::Tensor& u) {
  TORCH_CHECK(!sources.empty(), "attnres: need at least one source");
  const int64_t width = sources[0].size(-1);
  for (const auto& s : sources) {
    TORCH_CHECK(s.is_contiguous() && s.sizes() == sources[0].sizes() &&
                    s.scalar_type() == u.scalar_type(),
                "attnres: sources must be contiguous, of one shape and of the query's type");
  }
  TORCH_CHECK(u.dim() == 1 && u.size(0) == width && u.is_contiguous(),
              "attnres: query must be [d], d the sources' last size");
}

}  // namespace

// sources: N tensors [..., d]; u [d]. Returns {out [..., d], weights [N, rows], rms [N, rows]}.
std::vector<at::Tensor> attnres_forward_op(const std::vector<at::Tensor>& sources,
                                           const at::Tensor& u, double eps) {
  check_sources(sources, u);
  const int64_t num = sources.size(), width = u.size(0), rows = sources[0].numel() / width;
  auto out = at::empty_like(sources[0]);
  auto weights = at::empty({num, rows}, u.options());
  auto rms = at::empty({num, rows}, u.options());
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "attnres_forward", [&] {
    using T = scalar_t;
    using V = Vec<T>;
    const auto src = pointers<T>(sources);
    const T* up = u.data_ptr<T>();
    T *op = out.data_ptr<T>(), *wp = weights.data_ptr<T>(), *rp = rms.data_ptr<T>();
    std::vector<T> score(num);
    for (int64_t row = 0; row < rows; ++row) {
      T best = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < num; ++j) {
        const T* v = src[j] + row * width;
        const T r = T(1) / std::sqrt(dot(v, v, width) / T(width) + T(eps));
        rp[j * rows + row] = r;
        score[j] = r * dot(v, up, width);
        best = std::max(best, score[j]);
      }
      T total = T(0);
      for (int64_t j = 0; j < num; ++j) total += (score[j] = std::exp(score[j] - best));
      T* o = op + row * width;
      for (int64_t c = 0; c < width; c += V::size()) store(V(T(0)), o + c,
                                                         std::min<int64_t>(V::size(), width - c));
      for (int64_t j = 0; j < num; ++j) {
        const T p = score[j] / total;
        wp[j * rows + row] = p;
        add_scaled(p, src[j] + row * width, o, width);
      }
    }
  });
  return {out, weights, rms};
}

// Backward: {dV_1..dV_N, du}, with g the output gradient, dp_j = g . V_j,
// ds_j = p_j (dp_j - sum_i p_i dp_i), dV_j = p_j g + ds_j (r_j u - r_j^3 z_j V_j / d),
// du = sum over rows and j of ds_j r_j V_j.
std::vector<at::Tensor> attnres_backward_op(const at::Tensor& grad_out_any,
                                            const std::vector<at::Tensor>& sources,
                                            const at::Tensor& u, const at::Tensor& weights,
                                            const at::Tensor& rms) {
  const auto grad_out = grad_out_any.contiguous();
  check_sources(sources, u);
  TORCH_CHECK(grad_out.sizes() == sources[0].sizes(), "attnres_backward: grad_out shape");
  const int64_t num = sources.size(), width = u.size(0), rows = sources[0].numel() / width;
  std::vector<at::Tensor> grads;
  for (int64_t j = 0; j < num; ++j) grads.push_back(at::empty_like(sources[j]));
  auto du = at::zeros_like(u);
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "attnres_backward", [&] {
    using T = scalar_t;
    const auto src = pointers<T>(sources);
    std::vector<T*> dst;
    for (auto& g : grads) dst.push_back(g.data_ptr<T>());
    const T *up = u.data_ptr<T>(), *gp = grad_out.data_ptr<T>();
    const T *wp = weights.data_ptr<T>(), *rp = rms.data_ptr<T>();
    T* dup = du.data_ptr<T>();
    std::vector<T> dp(num);
    for (int64_t row = 0; row < rows; ++row) {
      const T* g = gp + row * width;
      T mean = T(0);
      for (int64_t j = 0; j < num; ++j) {
        dp[j] = dot(g, src[j] + row * width, width);
        mean += wp[j * rows + row] * dp[j];
      }
      for (int64_t j = 0; j < num; ++j) {
        const T* v = src[j] + row * width;
        T* dv = dst[j] + row * width;
        const T p = wp[j * rows + row], r = rp[j * rows + row];
        const T ds = p * (dp[j] - mean);
        const T z = dot(v, up, width);
        // dv = p g + ds r u - ds r^3 z / d v
        const T along_v = -ds * r * r * r * z / T(width);
        using V = Vec<T>;
        for (int64_t c = 0; c < width; c += V::size()) {
          const int64_t count = std::min<int64_t>(V::size(), width - c);
          const V vv = load(v + c, count);
          V acc = V(p) * load(g + c, count);
          acc = at::vec::fmadd(V(ds * r), load(up + c, count), acc);
          store(at::vec::fmadd(V(along_v), vv, acc), dv + c, count);
        }
        add_scaled(ds * r, v, dup, width);
      }
    }
  });
  grads.push_back(du);
  return grads;
}
