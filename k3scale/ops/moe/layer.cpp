// Whole MoE layers, K2 and K3 (Stable LatentMoE), composed from the experts and router
// kernels, one call per direction: eager Python between the pieces had cost about as much as
// their arithmetic at the ladder's d = 16-64. Python side: fused.py; references: the composed
// layers in models/moe.py.

#include "../cpu/common.h"
#include "../cpu/ops.h"

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
