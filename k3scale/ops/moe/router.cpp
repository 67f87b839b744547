// The router after its linear map: sigmoid scores, top-k with the balancing bias, routing
// weights, and the sequence-wise aux loss. Python side: fused.py; references: models/router.py.

#include <array>
#include <iterator>
#include <limits>

#include "../cpu/common.h"
#include "../cpu/ops.h"

namespace {

// Slots left at -1 (a row whose values never beat -inf: NaN or -inf throughout) take the lowest
// experts not yet in the row, so every index is valid and the row's experts are distinct.
inline void fill_unselected(int64_t* row, int64_t count) {
  int64_t next = 0;
  for (int64_t p = 0; p < count; ++p) {
    if (row[p] >= 0) continue;
    while (std::find(row, row + count, next) != row + count) ++next;
    row[p] = next++;
  }
}

}  // namespace

template <int64_t C>
void select_top_block(const float* block, int64_t num_experts, int64_t count, float* lane_values,
                      float* lane_index) {
  using V = Vec<float>;
  constexpr int64_t L = V::size();
  using Slots = std::conditional_t<(C > 0), std::array<V, (C > 0 ? C : 1)>, std::vector<V>>;
  Slots vals{}, idx{};
  if constexpr (C == 0) {
    vals.resize(count);
    idx.resize(count);
  }
  const int64_t slots = C > 0 ? C : count;
  for (int64_t p = 0; p < slots; ++p) {
    vals[p] = V(-std::numeric_limits<float>::infinity());
    idx[p] = V(-1.f);
  }
  for (int64_t e = 0; e < num_experts; ++e) {
    V candidate = V::loadu(block + e * L);
    V candidate_index{float(e)};
#pragma GCC unroll 8
    for (int64_t p = 0; p < slots; ++p) {
      // Order by (value desc, expert asc): a displaced entry moving down must still pass
      // an equal value held by a higher expert.
      const V greater =
          (candidate > vals[p]) | ((candidate == vals[p]) & (candidate_index < idx[p]));
      const V kept = V::blendv(vals[p], candidate, greater);
      candidate = V::blendv(candidate, vals[p], greater);
      vals[p] = kept;
      const V kept_index = V::blendv(idx[p], candidate_index, greater);
      candidate_index = V::blendv(candidate_index, idx[p], greater);
      idx[p] = kept_index;
    }
  }
  for (int64_t p = 0; p < slots; ++p) {
    vals[p].store(lane_values + p * L);
    idx[p].store(lane_index + p * L);
  }
}

// Top `count` of biased = scores + bias per row: {values [N, count] fp32, index [N, count]
// int64}, larger first, the lower expert first on ties (torch.topk leaves tie order open).
// Vectorised across rows: each vector lane is one row (select_top_block). Rows whose values are
// all NaN or -inf (never from a sigmoid) fall back to a scalar fill, so indices are always valid
// and distinct.
std::vector<at::Tensor> select_top_op(const at::Tensor& scores, const at::Tensor& bias,
                                      int64_t count) {
  TORCH_CHECK(scores.dim() == 2 && scores.is_contiguous() && scores.scalar_type() == at::kFloat &&
                  bias.scalar_type() == at::kFloat && bias.is_contiguous() &&
                  bias.numel() == scores.size(1),
              "select_top: expected contiguous fp32 scores [N, E] and bias [E]");
  const int64_t num_rows = scores.size(0), num_experts = scores.size(1);
  TORCH_CHECK(count >= 1 && count <= num_experts, "select_top: count must be in [1, E]");
  auto values = at::empty({num_rows, count}, scores.options());
  auto index = at::empty({num_rows, count}, scores.options().dtype(at::kLong));
  const float *s = scores.data_ptr<float>(), *b = bias.data_ptr<float>();
  float* out_values = values.data_ptr<float>();
  int64_t* out_index = index.data_ptr<int64_t>();
  constexpr int64_t L = Vec<float>::size();
  using BlockFn = void (*)(const float*, int64_t, int64_t, float*, float*);
  // Fixed counts cover top-k and top-(k+1) of every ladder and preset (k <= 8).
  constexpr BlockFn kFixed[] = {select_top_block<0>, select_top_block<1>, select_top_block<2>,
                                select_top_block<3>, select_top_block<4>, select_top_block<5>,
                                select_top_block<6>, select_top_block<7>, select_top_block<8>,
                                select_top_block<9>};
  const BlockFn select = count < int64_t(std::size(kFixed)) ? kFixed[count] : kFixed[0];
  std::vector<float> block(num_experts * L), lane_values(count * L), lane_index(count * L);
  const auto row_offsets = Vec<int32_t>::arange(0, int32_t(num_experts));  // lane l: row l
  for (int64_t r0 = 0; r0 < num_rows; r0 += L) {
    const int64_t rows = std::min(L, num_rows - r0);
    if (rows == L) {  // one gather per expert column (a scalar transpose took 40% of route)
      for (int64_t e = 0; e < num_experts; ++e) {
        const auto column = at::vec::gather<4>(s + r0 * num_experts + e, row_offsets);
        (column + Vec<float>(b[e])).store(block.data() + e * L);
      }
    } else {
      for (int64_t l = 0; l < L; ++l) {
        for (int64_t e = 0; e < num_experts; ++e) {
          block[e * L + l] = l < rows ? s[(r0 + l) * num_experts + e] + b[e] : 0.f;
        }
      }
    }
    select(block.data(), num_experts, count, lane_values.data(), lane_index.data());
    for (int64_t l = 0; l < rows; ++l) {
      for (int64_t p = 0; p < count; ++p) {
        out_values[(r0 + l) * count + p] = lane_values[p * L + l];
        out_index[(r0 + l) * count + p] = int64_t(lane_index[p * L + l]);
      }
      fill_unselected(out_index + (r0 + l) * count, count);
    }
  }
  return {values, index};
}

// The router after its linear map (architecture.md 5.1), fp32: scores = sigmoid(logits);
// selection = top `count` of scores + bias (select_top's order); weights = rho * s_sel / sum s_sel
// over the first k selections. Returns {scores [N, E], values [N, count], index [N, count],
// weights [N, k]}.
std::vector<at::Tensor> route_forward_op(const at::Tensor& logits, const at::Tensor& bias,
                                         int64_t top_k, int64_t count, double routed_scale) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.scalar_type() == at::kFloat,
              "route: expected contiguous fp32 logits [N, E]");
  TORCH_CHECK(top_k >= 1 && top_k <= count, "route: need 1 <= top_k <= count");
  auto scores = at::empty_like(logits);
  {
    using V = Vec<float>;
    const float* in = logits.data_ptr<float>();
    float* out = scores.data_ptr<float>();
    const int64_t n = logits.numel();
    for (int64_t i = 0; i < n; i += V::size()) {
      const int64_t m = std::min<int64_t>(V::size(), n - i);
      store(sigmoid_accurate(load(in + i, m)), out + i, m);
    }
  }
  auto selection = select_top_op(scores, bias, count);
  const auto& index = selection[1];
  const int64_t num_rows = logits.size(0), num_experts = logits.size(1);
  auto weights = at::empty({num_rows, top_k}, logits.options());
  const float* s = scores.data_ptr<float>();
  const int64_t* idx = index.data_ptr<int64_t>();
  float* w = weights.data_ptr<float>();
  for (int64_t row = 0; row < num_rows; ++row) {
    float total = 0;
    for (int64_t j = 0; j < top_k; ++j) total += s[row * num_experts + idx[row * count + j]];
    const float scale = float(routed_scale) / total;
    for (int64_t j = 0; j < top_k; ++j) {
      w[row * top_k + j] = scale * s[row * num_experts + idx[row * count + j]];
    }
  }
  return {scores, selection[0], index, weights};
}

// Gradient of route_forward's logits from those of scores and weights.
at::Tensor route_backward_op(const at::Tensor& grad_scores, const at::Tensor& grad_weights,
                             const at::Tensor& scores, const at::Tensor& index,
                             const at::Tensor& weights, double routed_scale) {
  const int64_t num_rows = scores.size(0), num_experts = scores.size(1);
  const int64_t top_k = weights.size(1), count = index.size(1);
  // An empty grad_scores stands for zeros (scores unused downstream).
  auto grad = grad_scores.numel() ? grad_scores.contiguous().clone() : at::zeros_like(scores);
  const auto dw_c = grad_weights.contiguous();
  const float *s = scores.data_ptr<float>(), *w = weights.data_ptr<float>();
  const float* dw = dw_c.data_ptr<float>();
  const int64_t* idx = index.data_ptr<int64_t>();
  float* ds = grad.data_ptr<float>();
  for (int64_t row = 0; row < num_rows; ++row) {
    // w_j = rho c_j / S: dc_m = (dw_m - sum_j dw_j w_j / rho) rho / S.
    float total = 0, projected = 0;
    for (int64_t j = 0; j < top_k; ++j) {
      total += s[row * num_experts + idx[row * count + j]];
      projected += dw[row * top_k + j] * w[row * top_k + j];
    }
    projected /= float(routed_scale);
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t e = idx[row * count + j];
      ds[row * num_experts + e] += (dw[row * top_k + j] - projected) * float(routed_scale) / total;
    }
    for (int64_t e = 0; e < num_experts; ++e) {
      const float sig = s[row * num_experts + e];
      ds[row * num_experts + e] *= sig * (1 - sig);
    }
  }
  return grad;
}

// DeepSeek-V3 sequence-wise balance loss (router.sequence_aux_loss): alpha / B sum_b sum_e
// f_be P_be with f_be = E / (k T) #{t in b : e selected} and P_be = mean_t s_te / sum_e' s_te'.
// Returns {loss (0-dim), coefficient [B, E] = alpha f_be / (B T)}; the backward needs only the
// coefficient: d loss / d s'_te = coefficient[b(t), e].
std::vector<at::Tensor> sequence_aux_forward_op(const at::Tensor& scores, const at::Tensor& index,
                                                int64_t top_k, int64_t num_sequences,
                                                double alpha) {
  TORCH_CHECK(scores.dim() == 2 && scores.is_contiguous() && scores.scalar_type() == at::kFloat,
              "sequence_aux: expected contiguous fp32 scores [N, E]");
  const int64_t num_rows = scores.size(0), num_experts = scores.size(1), count = index.size(1);
  const int64_t seq_len = num_rows / num_sequences;
  auto coefficient = at::zeros({num_sequences, num_experts}, scores.options());
  const float* s = scores.data_ptr<float>();
  const int64_t* idx = index.data_ptr<int64_t>();
  float* coef = coefficient.data_ptr<float>();
  const double f_scale = double(num_experts) / (double(top_k) * double(seq_len));
  double loss = 0;
  std::vector<double> probability(num_experts);
  for (int64_t b = 0; b < num_sequences; ++b) {
    std::fill(probability.begin(), probability.end(), 0.0);
    float* c = coef + b * num_experts;
    for (int64_t t = b * seq_len; t < (b + 1) * seq_len; ++t) {
      double total = 0;
      for (int64_t e = 0; e < num_experts; ++e) total += s[t * num_experts + e];
      const double inverse = 1.0 / total;  // one division per token, not per expert
      for (int64_t e = 0; e < num_experts; ++e) probability[e] += s[t * num_experts + e] * inverse;
      for (int64_t j = 0; j < top_k; ++j) c[idx[t * count + j]] += 1;
    }
    for (int64_t e = 0; e < num_experts; ++e) {
      const double fraction = f_scale * c[e];
      loss += fraction * probability[e] / double(seq_len);
      c[e] = float(alpha * fraction / (double(num_sequences) * double(seq_len)));
    }
  }
  return {at::scalar_tensor(alpha * loss / double(num_sequences), scores.options()), coefficient};
}

// d loss / d scores [N, E] for the loss of sequence_aux_forward_op, times grad_loss.
at::Tensor sequence_aux_backward_op(const at::Tensor& grad_loss, const at::Tensor& scores,
                                    const at::Tensor& coefficient) {
  const int64_t num_rows = scores.size(0), num_experts = scores.size(1);
  const int64_t seq_len = num_rows / coefficient.size(0);
  auto grad = at::empty_like(scores);
  const float upstream = grad_loss.item<float>();
  const float *s = scores.data_ptr<float>(), *coef = coefficient.data_ptr<float>();
  float* ds = grad.data_ptr<float>();
  for (int64_t t = 0; t < num_rows; ++t) {
    // s'_e = s_e / Z: ds_m = (g_m - sum_e g_e s'_e) / Z with g = coefficient of t's sequence.
    const float* c = coef + (t / seq_len) * num_experts;
    float total = 0, projected = 0;
    for (int64_t e = 0; e < num_experts; ++e) total += s[t * num_experts + e];
    for (int64_t e = 0; e < num_experts; ++e) projected += c[e] * s[t * num_experts + e];
    const float scale = upstream / total;
    projected /= total;
    for (int64_t e = 0; e < num_experts; ++e) ds[t * num_experts + e] = scale * (c[e] - projected);
  }
  return grad;
}
