"""`k3scale.bench.kernel_bound`: every C++ kernel call and aten GEMM of a step is recorded once,
with arguments a later call cannot change, and timed alone."""

from __future__ import annotations

import torch

from k3scale.bench.gemm_bound import GemmRecorder
from k3scale.bench.kernel_bound import record_compute, time_compute
from k3scale.ops.attention.causal import causal_attention
from tests.conftest import require_fused_kernels


def attention_then_projection() -> torch.Tensor:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 2, 4, requires_grad=True) for _ in range(3))
    out, _ = causal_attention(q, k, v, 0.5)
    projected = out.reshape(16, 8) @ torch.randn(8, 3)
    projected.sum().backward()
    return q.grad


def test_records_kernels_and_gemms_and_restores_the_module():
    module = require_fused_kernels()
    before = module.causal_attention_forward
    gemms, kernels = record_compute(attention_then_projection)
    assert [call.name for call in kernels] == [
        "causal_attention_forward",
        "causal_attention_backward",
    ]
    # The projection's forward, then its backward's product for the attention output's grad.
    assert [call.op.overloadpacket.__name__ for call in gemms] == ["mm", "mm"]
    assert module.causal_attention_forward is before
    # What was recorded gives the same answer as the step, whatever the step did to its tensors.
    forward = kernels[0]
    for tensor in forward.args[:3]:
        tensor.requires_grad_(False)
    out, lse, _ = forward.run_alone()()
    again, lse_again, _ = forward.run_alone()()
    assert torch.equal(out, again) and torch.equal(lse, lse_again)
    assert torch.equal(attention_then_projection(), attention_then_projection())


def test_a_paused_recorder_notes_no_gemm():
    recorder = GemmRecorder()
    with recorder:
        recorder.paused += 1
        torch.randn(3, 3) @ torch.randn(3, 3)
        recorder.paused -= 1
        torch.randn(3, 3) @ torch.randn(3, 3)
    assert len(recorder.calls) == 1


def test_time_compute_sums_gemms_and_kernels():
    require_fused_kernels()
    timed = time_compute(attention_then_projection, seconds_per_call=0.003)
    assert (timed["gemm_calls"], timed["kernel_calls"]) == (2, 2)
    kernels = timed["kernel_seconds"]
    assert set(kernels) == {"causal_attention_forward", "causal_attention_backward"}
    assert all(seconds > 0 for seconds in kernels.values()) and timed["gemm_seconds"] > 0
    assert timed["seconds"] == timed["gemm_seconds"] + sum(kernels.values())
