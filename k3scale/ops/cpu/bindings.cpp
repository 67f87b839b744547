// The extension's Python module: every entry point declared in ops.h.

#include <torch/python.h>

#include "ops.h"

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
  m.def("causal_attention_forward", &causal_attention_forward_op);
  m.def("causal_attention_backward", &causal_attention_backward_op);
  m.def("attnres_forward", &attnres_forward_op);
  m.def("attnres_backward", &attnres_backward_op);
  m.def("kda_recurrent_forward", &kda_recurrent_forward_op);
  m.def("kda_recurrent_backward", &kda_recurrent_backward_op);
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
