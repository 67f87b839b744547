"""The fused AttnRes kernel (ops/attnres/fused.py) against the torch reference in
models/attnres.py: output and the gradients of every source, the query and the key norm."""

from __future__ import annotations

import pytest
import torch

from k3scale.models.attnres import AttnResSite, attn_res
from k3scale.ops.attnres.fused import attn_res_fused
from tests.conftest import require_fused_kernels

# fp64: reassociation only. fp32: observed ~1e-7 relative; bound 1e-5 as for the other kernels.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}


@pytest.fixture(scope="module", autouse=True)
def kernels():
    return require_fused_kernels()


def rel(actual: torch.Tensor, expected: torch.Tensor) -> float:
    scale = expected.double().abs().max().clamp(min=1e-3)
    return ((actual.double() - expected.double()).abs().max() / scale).item()


def grads(fn, sources, query, weight, probe):
    leaves = [s.clone().requires_grad_() for s in sources]
    q, w = query.clone().requires_grad_(), weight.clone().requires_grad_()
    out = fn(leaves, q, w, 1e-5)
    (out * probe).sum().backward()
    return [out.detach(), *(s.grad for s in leaves), q.grad, w.grad]


@pytest.mark.parametrize("num_sources", [1, 2, 5])
@pytest.mark.parametrize("width", [8, 13, 64])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_matches_the_reference(num_sources, width, dtype):
    gen = torch.Generator().manual_seed(num_sources * 100 + width)
    # Sources of different scales, so the key RMSNorm matters.
    sources = [
        (j + 1) * torch.randn(3, 7, width, generator=gen, dtype=dtype) for j in range(num_sources)
    ]
    query = torch.randn(width, generator=gen, dtype=dtype)
    weight = 1 + 0.3 * torch.randn(width, generator=gen, dtype=dtype)
    probe = torch.randn(3, 7, width, generator=gen, dtype=dtype)
    expected = grads(attn_res, sources, query, weight, probe)
    actual = grads(attn_res_fused, sources, query, weight, probe)
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert rel(a, e) < TOLERANCE[dtype], index


def test_site_falls_back_to_torch_under_autocast():
    site = AttnResSite(16, 1e-5, fused=True)
    with torch.no_grad():
        site.query.normal_()
    sources = [torch.randn(2, 3, 16) for _ in range(3)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = site([s.to(torch.bfloat16) for s in sources])
    assert out.dtype == torch.bfloat16  # the reference path's contract (sources' dtype)
    assert rel(site(sources), attn_res(sources, site.query, site.key_norm, 1e-5)) < 1e-5
