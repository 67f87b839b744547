"""The C++ KDA recurrence (ops/kda/recurrent.py) against naive_recurrent_kda and chunk_kda:
outputs, final state and every gradient (q, k, v, g, beta, initial state)."""

from __future__ import annotations

import pytest
import torch

from k3scale.ops.kda import chunk_kda, naive_recurrent_kda
from k3scale.ops.kda.recurrent import (
    RECURRENT_MAX_STATE,
    SEGMENT,
    kda_cpu,
    recurrent_kda,
    recurrent_supported,
)
from tests.conftest import require_fused_kernels
from tests.ops.test_kda import TOLERANCE, make_inputs, rel_rms

NAMES = ("q", "k", "v", "g", "beta", "initial_state")


@pytest.fixture(scope="module", autouse=True)
def kernels():
    return require_fused_kernels()


def outputs_and_grads(fn, inputs: dict[str, torch.Tensor], seed: int):
    """`fn`'s output, final state and the gradients of a random projection of both."""
    leaves = {name: x.clone().requires_grad_() for name, x in inputs.items()}
    o, final = fn(**leaves, scale=0.7, output_final_state=True)
    gen = torch.Generator().manual_seed(seed)
    weights_o = torch.randn(o.shape, generator=gen, dtype=o.dtype)
    weights_s = torch.randn(final.shape, generator=gen, dtype=final.dtype)
    ((o * weights_o).sum() + (final * weights_s).sum()).backward()
    return o.detach(), final.detach(), {name: leaves[name].grad for name in NAMES}


# Lengths around the checkpoint segment: inside one, exactly one, across several with a tail.
@pytest.mark.parametrize("seq_len", [1, 7, SEGMENT, 2 * SEGMENT + 13])
@pytest.mark.parametrize("gate", ["logsigmoid", "bounded", "softplus"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_recurrence_matches_the_naive_reference(seq_len, gate, dtype):
    inputs = make_inputs(seq_len, gate, dtype, seed=seq_len, batch=2, heads=3, d_key=8, d_value=6)
    expected = outputs_and_grads(naive_recurrent_kda, inputs, seed=1)
    actual = outputs_and_grads(recurrent_kda, inputs, seed=1)
    assert rel_rms(actual[0], expected[0]) < TOLERANCE[dtype]
    assert rel_rms(actual[1], expected[1]) < TOLERANCE[dtype]
    for name in NAMES:
        assert rel_rms(actual[2][name], expected[2][name]) < TOLERANCE[dtype], name


@pytest.mark.parametrize(("d_key", "d_value"), [(4, 4), (16, 16), (5, 11)])
def test_recurrence_matches_chunk_kda_at_ladder_widths(d_key, d_value):
    # fp32, as training runs: the two fast paths, each within TOLERANCE of the other.
    inputs = make_inputs(
        150, "bounded", torch.float32, seed=3, batch=2, heads=2, d_key=d_key, d_value=d_value
    )
    expected = outputs_and_grads(chunk_kda, inputs, seed=2)
    actual = outputs_and_grads(recurrent_kda, inputs, seed=2)
    assert rel_rms(actual[0], expected[0]) < TOLERANCE[torch.float32]
    for name in NAMES:
        assert rel_rms(actual[2][name], expected[2][name]) < TOLERANCE[torch.float32], name


def test_output_alone_gets_gradients_without_the_final_state():
    inputs = make_inputs(40, "logsigmoid", torch.float64, seed=4, d_key=4, d_value=4)
    grads = []
    for fn in (naive_recurrent_kda, recurrent_kda):
        leaves = {name: x.clone().requires_grad_() for name, x in inputs.items()}
        o, final = fn(**leaves)
        assert final is None
        o.square().sum().backward()
        grads.append([leaves[name].grad for name in NAMES])
    for name, actual, expected in zip(NAMES, grads[1], grads[0], strict=True):
        assert rel_rms(actual, expected) < TOLERANCE[torch.float64], name


def test_bf16_inputs_compute_in_fp32_and_return_bf16():
    inputs = make_inputs(30, "bounded", torch.float32, seed=5, d_key=8, d_value=8)
    low = {name: x.to(torch.bfloat16) for name, x in inputs.items()}
    o, final = recurrent_kda(**low, output_final_state=True)
    expected, _ = naive_recurrent_kda(**low, output_final_state=True)
    assert o.dtype == torch.bfloat16 and final.dtype == torch.float32
    assert rel_rms(o, expected) < 1e-2  # both round the same fp32 result to bf16


def test_kda_cpu_takes_the_recurrence_only_for_small_states():
    small = make_inputs(10, "bounded", torch.float32, seed=6, d_key=8, d_value=8)
    assert recurrent_supported(small["q"], small["v"])
    width = int(RECURRENT_MAX_STATE**0.5) + 1
    wide = make_inputs(10, "bounded", torch.float32, seed=6, d_key=width, d_value=width)
    assert not recurrent_supported(wide["q"], wide["v"])
    # Either way the result is KDA's.
    for inputs in (small, wide):
        expected, _ = naive_recurrent_kda(**inputs)
        actual, _ = kda_cpu(**inputs)
        assert rel_rms(actual, expected) < TOLERANCE[torch.float32]
