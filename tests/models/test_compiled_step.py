"""Issue 34: the fast path's training step is one graph to torch.compile. Every fused kernel is
a custom op with a fake kernel and an autograd formula, and the kernels' availability is a
constant to Dynamo, so a forward+backward of each architecture's study model compiles to one
forward and one backward graph (a graph break would add a pair)."""

from __future__ import annotations

import pytest
import torch

from k3scale.bench.compile import compiled_graphs, training_model
from tests.conftest import require_fused_kernels


@pytest.mark.parametrize("name", ["k2-s1", "k3-s1"])
def test_the_fast_training_step_compiles_to_one_forward_and_one_backward_graph(name):
    require_fused_kernels()
    model = training_model(name, "cpu")
    tokens = torch.randint(
        0, model.cfg.vocab_size, (2, 65), generator=torch.Generator().manual_seed(0)
    )
    assert compiled_graphs(model, tokens) == {"forward_graphs": 1, "backward_graphs": 1}
