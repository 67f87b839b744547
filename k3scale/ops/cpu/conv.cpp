// Python side: conv.py; torch reference: models/kda.py.

#include "common.h"
#include "ops.h"

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
