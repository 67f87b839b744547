"""The fused kernels' custom ops (causal attention, GLU, KDA's short convolution, the chunked
head cross-entropy) pass `torch.library.opcheck`: their schemas, fake kernels (the shapes
torch.compile traces with) and autograd registrations agree with what the kernels do. The ops'
numbers against the torch references are tested beside each op."""

from __future__ import annotations

import pytest
import torch

from k3scale.ops.attention.causal import attention_backward, attention_forward
from k3scale.ops.cpu import SITU, SWIGLU
from k3scale.ops.cpu.conv import conv_silu_backward, conv_silu_forward
from k3scale.ops.head_ce.chunked import head_cross_entropy_with_grads
from k3scale.ops.situ.cpu import glu_backward, glu_forward
from tests.conftest import require_fused_kernels


@pytest.fixture(scope="module", autouse=True)
def kernels():
    return require_fused_kernels()


def _randn(*shape, grad=False):
    gen = torch.Generator().manual_seed(sum(shape))
    return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_(grad)


def test_causal_attention_ops():
    q, k, v = _randn(2, 7, 3, 5, grad=True), _randn(2, 7, 3, 5, grad=True), _randn(2, 7, 3, 4)
    torch.library.opcheck(attention_forward, (q, k, v.requires_grad_(), 0.4))
    out, lse, _ = attention_forward(q.detach(), k.detach(), v.detach(), 0.4)
    args = (_randn(2, 7, 3, 4), q.detach(), k.detach(), v.detach(), out, lse, 0.4)
    torch.library.opcheck(attention_backward, args)


@pytest.mark.parametrize("activation", [(SWIGLU, 0.0, 0.0), (SITU, 3.0, 2.0)])
def test_glu_ops(activation):
    gate, up = _randn(6, 9, grad=True), _randn(6, 9, grad=True)
    torch.library.opcheck(glu_forward, (gate, up, *activation))
    args = (gate.detach(), up.detach(), _randn(6, 9), *activation)
    torch.library.opcheck(glu_backward, args)


def test_conv_silu_ops():
    padded, weight = _randn(2, 9, 5, grad=True), _randn(5, 4, grad=True)
    torch.library.opcheck(conv_silu_forward, (padded, weight))
    _, pre = conv_silu_forward(padded.detach(), weight.detach())
    args = (_randn(2, 6, 5), padded.detach(), weight.detach(), pre)
    torch.library.opcheck(conv_silu_backward, args)


def test_head_cross_entropy_op():
    hidden, weight = _randn(10, 6, grad=True), _randn(17, 6, grad=True)
    targets = torch.tensor([0, 3, 16, 5, 5, 1, 9, 2, 11, 4])
    torch.library.opcheck(head_cross_entropy_with_grads, (hidden, weight, targets, 4))
