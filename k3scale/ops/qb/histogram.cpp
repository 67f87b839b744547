// Python side and torch reference: histogram.py.

#include "../cpu/common.h"
#include "../cpu/ops.h"

// Quantile Balancing margin counts (ops/qb/histogram.margin_counts): [E, 1 + R] int64. Column 0
// counts each token's (k+1)-th expert (the point mass); the other margins s - cutoff fall into R
// bins of width `width` from `lo`, out-of-range (and NaN) clamped. The bin arithmetic is the same
// fp64 subtract, subtract, divide, floor as the torch version, so the counts are identical.
at::Tensor margin_counts_op(const at::Tensor& scores, const at::Tensor& cutoff,
                            const at::Tensor& cutoff_expert, double lo, double width,
                            int64_t num_bins) {
  TORCH_CHECK(scores.dim() == 2 && scores.is_contiguous() && scores.scalar_type() == at::kFloat,
              "margin_counts: expected contiguous fp32 scores [N, E]");
  const int64_t num_rows = scores.size(0), num_experts = scores.size(1);
  auto counts = at::zeros({num_experts, num_bins + 1}, cutoff_expert.options());
  const auto cutoff_c = cutoff.contiguous().to(at::kFloat);
  const auto expert_c = cutoff_expert.contiguous();
  const float *s = scores.data_ptr<float>(), *c = cutoff_c.data_ptr<float>();
  const int64_t* owner = expert_c.data_ptr<int64_t>();
  int64_t* out = counts.data_ptr<int64_t>();
  for (int64_t t = 0; t < num_rows; ++t) {
    const double alpha = c[t];
    for (int64_t e = 0; e < num_experts; ++e) {
      if (e == owner[t]) {
        ++out[e * (num_bins + 1)];
        continue;
      }
      const double position = std::floor((double(s[t * num_experts + e]) - alpha - lo) / width);
      const int64_t bin =
          position >= 0 ? std::min<int64_t>(int64_t(std::min(position, 1e18)), num_bins - 1) : 0;
      ++out[e * (num_bins + 1) + 1 + bin];
    }
  }
  return counts;
}
