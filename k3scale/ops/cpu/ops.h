// Entry points of the fused CPU kernels, for the small layers of the study ladders (d 16-256),
// where eager torch spends its time on per-op overhead rather than arithmetic. Each op's source
// sits in its folder beside its Python wrapper and torch reference; the tests compare outputs and
// every gradient. bindings.cpp exposes them all in one extension, which build.py compiles on
// first use. Contracts are documented at the definitions.

#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

// situ/glu.cpp
at::Tensor glu_forward_op(const at::Tensor& gate, const at::Tensor& up, int64_t kind, double beta,
                          double linear_beta);
std::vector<at::Tensor> glu_backward_op(const at::Tensor& gate, const at::Tensor& up,
                                        const at::Tensor& grad_out, int64_t kind, double beta,
                                        double linear_beta);

// moe/experts.cpp
std::vector<at::Tensor> experts_forward_op(const at::Tensor& x, const at::Tensor& weight_flat,
                                           const at::Tensor& order, const at::Tensor& token_of,
                                           const at::Tensor& position, const at::Tensor& offsets,
                                           const at::Tensor& w_gate, const at::Tensor& w_up,
                                           const at::Tensor& w_down, int64_t kind, double beta,
                                           double linear_beta);
std::vector<at::Tensor> experts_backward_op(const at::Tensor& grad_out, const at::Tensor& x,
                                            const at::Tensor& weight_flat, const at::Tensor& order,
                                            const at::Tensor& token_of, const at::Tensor& position,
                                            const at::Tensor& offsets, const at::Tensor& w_gate,
                                            const at::Tensor& w_up, const at::Tensor& w_down,
                                            const at::Tensor& pre, int64_t kind, double beta,
                                            double linear_beta);
std::vector<at::Tensor> plan_dispatch_op(const at::Tensor& expert_idx, int64_t num_experts);

// moe/router.cpp
std::vector<at::Tensor> select_top_op(const at::Tensor& scores, const at::Tensor& bias,
                                      int64_t count);
std::vector<at::Tensor> route_forward_op(const at::Tensor& logits, const at::Tensor& bias,
                                         int64_t top_k, int64_t count, double routed_scale);
at::Tensor route_backward_op(const at::Tensor& grad_scores, const at::Tensor& grad_weights,
                             const at::Tensor& scores, const at::Tensor& index,
                             const at::Tensor& weights, double routed_scale);
std::vector<at::Tensor> sequence_aux_forward_op(const at::Tensor& scores, const at::Tensor& index,
                                                int64_t top_k, int64_t num_sequences,
                                                double alpha);
at::Tensor sequence_aux_backward_op(const at::Tensor& grad_loss, const at::Tensor& scores,
                                    const at::Tensor& coefficient);

// moe/layer.cpp
at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& weight);
at::Tensor linear_rows_backward(const at::Tensor& grad_y_any, const at::Tensor& x,
                                const at::Tensor& weight_any, at::Tensor& grad_x, bool accumulate);
std::vector<at::Tensor> moe_layer_forward_op(
    const at::Tensor& x_any, const at::Tensor& router_weight, const at::Tensor& bias,
    const at::Tensor& w_gate_any, const at::Tensor& w_up_any, const at::Tensor& w_down_any,
    const at::Tensor& s_gate, const at::Tensor& s_up, const at::Tensor& s_down, int64_t top_k,
    int64_t count, double routed_scale, int64_t num_sequences, double alpha, int64_t kind,
    double beta, double linear_beta);
std::vector<at::Tensor> moe_layer_backward_op(const at::Tensor& grad_out,
                                              const at::Tensor& grad_aux,
                                              const std::vector<at::Tensor>& saved,
                                              double routed_scale, int64_t kind, double beta,
                                              double linear_beta);
std::vector<at::Tensor> latent_moe_layer_forward_op(
    const at::Tensor& x_any, const at::Tensor& router_weight, const at::Tensor& bias,
    const at::Tensor& latent_down, const at::Tensor& latent_up, const at::Tensor& norm_weight,
    const at::Tensor& w_gate_any, const at::Tensor& w_up_any, const at::Tensor& w_down_any,
    const at::Tensor& s_gate, const at::Tensor& s_up, const at::Tensor& s_down, int64_t top_k,
    int64_t count, double routed_scale, int64_t num_sequences, double alpha, double eps,
    int64_t kind, double beta, double linear_beta);
std::vector<at::Tensor> latent_moe_layer_backward_op(const at::Tensor& grad_out_any,
                                                     const at::Tensor& grad_aux,
                                                     const std::vector<at::Tensor>& saved,
                                                     double routed_scale, int64_t kind, double beta,
                                                     double linear_beta);

// qb/histogram.cpp
at::Tensor margin_counts_op(const at::Tensor& scores, const at::Tensor& cutoff,
                            const at::Tensor& cutoff_expert, double lo, double width,
                            int64_t num_bins);

// head_ce/chunked.cpp
at::Tensor softmax_xent_grad_op(const at::Tensor& logits_t, const at::Tensor& targets,
                                double scale);

// attention/causal.cpp
std::vector<at::Tensor> causal_attention_forward_op(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, double scale);
std::vector<at::Tensor> causal_attention_backward_op(const at::Tensor& grad_out_any,
                                                     const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, const at::Tensor& out,
                                                     const at::Tensor& lse, double scale);

// attnres/fused.cpp
std::vector<at::Tensor> attnres_forward_op(const std::vector<at::Tensor>& sources,
                                           const at::Tensor& u, double eps);
std::vector<at::Tensor> attnres_backward_op(const at::Tensor& grad_out_any,
                                            const std::vector<at::Tensor>& sources,
                                            const at::Tensor& u, const at::Tensor& weights,
                                            const at::Tensor& rms);

// kda/recurrent.cpp
std::vector<at::Tensor> kda_recurrent_forward_op(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const at::Tensor& g,
                                                 const at::Tensor& beta,
                                                 const at::Tensor& initial, double scale,
                                                 int64_t segment);
std::vector<at::Tensor> kda_recurrent_backward_op(const at::Tensor& grad_out_any,
                                                  const at::Tensor& grad_final,
                                                  const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, const at::Tensor& g,
                                                  const at::Tensor& beta,
                                                  const at::Tensor& checkpoints, double scale,
                                                  int64_t segment);

// cpu/conv.cpp
std::vector<at::Tensor> conv_silu_forward_op(const at::Tensor& padded, const at::Tensor& weight);
std::vector<at::Tensor> conv_silu_backward_op(const at::Tensor& grad_y_any,
                                              const at::Tensor& padded, const at::Tensor& weight,
                                              const at::Tensor& pre);
