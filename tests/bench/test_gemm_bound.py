"""`k3scale.bench.gemm_bound`: every aten GEMM form is recorded with its FLOPs and layout."""

from __future__ import annotations

import torch

from k3scale.bench.gemm_bound import record_gemms, time_gemms
from tests.flops import profiled_matmul_flops


def every_gemm_form() -> None:
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    out = torch.empty(5, 3)
    torch.mm(a, b)
    torch.mm(a, b.t().contiguous().t(), out=out)
    torch.addmm(torch.randn(3), a, b)  # expanded bias: a stride-0 operand
    out.addmm_(a, b, beta=0.5)
    x, y = torch.randn(4, 5, 6), torch.randn(4, 6, 2)
    torch.bmm(x, y)
    torch.baddbmm(torch.randn(4, 5, 2), x, y, alpha=2.0)
    torch.nn.functional.linear(torch.randn(2, 3, 7), torch.randn(9, 7), torch.randn(9))


def test_records_every_form_with_the_profilers_flops():
    calls = record_gemms(every_gemm_form)
    assert [c.op.overloadpacket.__name__ for c in calls] == [
        "mm", "mm", "addmm", "addmm_", "bmm", "baddbmm", "addmm"
    ]  # fmt: skip
    # The profiler has no rule for the in-place `addmm_`: that one is checked by hand.
    in_place = [c.flops for c in calls if c.op.overloadpacket.__name__ == "addmm_"]
    assert in_place == [2 * 5 * 7 * 3]
    assert sum(c.flops for c in calls) - in_place[0] == profiled_matmul_flops(every_gemm_form)


def test_replays_keep_the_recorded_layouts():
    a = torch.randn(8, 4).t()  # a transposed (column-major) operand
    calls = record_gemms(lambda: torch.mm(a, torch.randn(8, 6)))
    (call,) = calls
    assert call.args[0].stride == (1, 4)
    replay = call.run_alone()
    assert replay().shape == (4, 6)


def test_time_gemms_counts_repeated_calls_once_per_layout():
    a, b = torch.randn(16, 16), torch.randn(16, 16)

    def three_products() -> None:
        torch.mm(a, b)
        torch.mm(a, b)
        torch.mm(a, b.t())

    result = time_gemms(record_gemms(three_products), seconds_per_call=0.003)
    assert (result["calls"], result["distinct"]) == (3, 2)
    assert result["flops"] == 3 * 2 * 16**3 and result["seconds"] > 0


def test_sees_the_gemms_inside_a_custom_op():
    # The head loss's training path is one custom op whose body runs three GEMMs per chunk; a
    # dispatch mode sees the op as one call unless the recorder runs its body (issue 34).
    from k3scale.ops.head_ce.chunked import head_cross_entropy

    hidden = torch.randn(8, 6, requires_grad=True)
    weight = torch.randn(11, 6, requires_grad=True)
    targets = torch.randint(0, 11, (8,))
    calls = record_gemms(lambda: head_cross_entropy(hidden, weight, targets, chunk_rows=4))
    assert [c.op.overloadpacket.__name__ for c in calls] == ["mm", "mm", "addmm_"] * 2
