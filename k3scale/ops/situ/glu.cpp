// GLU activations h = act(gate, up), forward and backward in one elementwise pass each
// (math in glu.h). Python side: cpu.py; references: naive.py.

#include "glu.h"

#include "../cpu/ops.h"

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
