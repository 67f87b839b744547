"""Per-step balancing (architecture.md 5.1, 7.3-7.5) through real MoE layers: the sign rule,
Quantile Balancing statistics over micro-batches and a real 2-process gloo all-reduce, eval
isolation, causality, and the router metrics."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from k3scale.models.balancing import moe_layers, update_balancing
from k3scale.models.config import MoEConfig
from k3scale.models.moe import MoE

D_MODEL, NUM_EXPERTS, TOP_K = 32, 16, 2


def make_moe(balancing: str, seed: int = 0) -> MoE:
    torch.manual_seed(seed)
    cfg = MoEConfig(
        num_experts=NUM_EXPERTS, top_k=TOP_K, d_expert=8, d_latent=16, balancing=balancing
    )
    moe = MoE(D_MODEL, cfg, "situ", 4.0, 25.0, 0.02, 1e-5)
    with torch.no_grad():
        # Router weights on a 2**-8 grid (|w| < 0.7) and inputs on a 2**-6 grid (|x| <= 1.5):
        # products lie on a 2**-14 grid and 32-term sums stay below 2**5, so every logit is
        # exact in fp32 whatever the summation order; scores then do not depend on how the
        # batch is split (the bitwise checks below test the balancing, not BLAS).
        grid = torch.randint(-128, 129, moe.router.weight.shape, generator=_gen(seed)) / 256
        # A per-expert skew (on the same grid) so the batch is clearly unbalanced.
        skew = (torch.arange(NUM_EXPERTS) - 7.5) / 64
        moe.router.weight.copy_(grid + skew[:, None])
    return moe


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def exact_tokens(num_tokens: int, seed: int = 1) -> torch.Tensor:
    values = torch.randint(-64, 65, (1, num_tokens, D_MODEL), generator=_gen(seed)) / 64
    return values + 0.5  # a common offset so the per-expert skew of the router matters


class TwoLayers(nn.Module):
    def __init__(self, balancing: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [nn.ModuleDict({"ffn": make_moe(balancing, seed=i)}) for i in range(2)]
        )

    def forward(self, x):
        for layer in self.layers:
            x = x + layer["ffn"](x)
        return x


def routed_loads(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    scores = torch.sigmoid(x.reshape(-1, D_MODEL) @ moe.router.weight.T)
    selection = torch.topk(scores + moe.bias, TOP_K).indices
    return torch.bincount(selection.reshape(-1), minlength=NUM_EXPERTS)


def test_sign_rule_moves_each_bias_by_exactly_u():
    moe = make_moe("loss_free")
    moe.train()
    x = exact_tokens(64)
    loads = routed_loads(moe, x)
    before = moe.bias.clone()
    moe(x)
    metrics = update_balancing(moe)
    mean_load = TOP_K * 64 / NUM_EXPERTS
    step = moe.bias - before
    u = torch.tensor(1e-3, dtype=torch.float32)
    assert (loads > mean_load).any() and (loads < mean_load).any()
    assert torch.equal(step[loads > mean_load], -u.expand(int((loads > mean_load).sum())))
    assert torch.equal(step[loads < mean_load], u.expand(int((loads < mean_load).sum())))
    assert torch.equal(step[loads == mean_load], torch.zeros(int((loads == mean_load).sum())))
    assert metrics["router/moe/max_load_ratio"] == pytest.approx(float(loads.max()) / mean_load)
    assert metrics["router/moe/bias_norm"] == pytest.approx(float(moe.bias.norm()))
    assert metrics["router/dropped_tokens"] == 0.0


def qb_bias_after_step(micro_batches: list[torch.Tensor]) -> torch.Tensor:
    moe = make_moe("quantile")
    moe.train()
    for x in micro_batches:
        moe(x)
    update_balancing(moe)
    return moe.bias.clone()


@pytest.mark.parametrize("num_micro_batches", [2, 8])
def test_quantile_bias_bitwise_identical_across_micro_batches(num_micro_batches):
    x = exact_tokens(256)
    whole = qb_bias_after_step([x])
    assert whole.abs().max() > 0  # the update did something
    split = qb_bias_after_step(list(torch.chunk(x, num_micro_batches, dim=1)))
    assert torch.equal(split, whole)


def _distributed_worker(rank: int, port: int, result_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        moe = make_moe("quantile")
        moe.train()
        moe(torch.chunk(exact_tokens(256), 2, dim=1)[rank])
        update_balancing(moe)
        torch.save(moe.bias.clone(), f"{result_dir}/bias{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_quantile_bias_bitwise_identical_over_two_gloo_ranks(tmp_path):
    # fork: the children inherit the imported modules, which keeps this test to a few seconds.
    mp.start_processes(
        _distributed_worker,
        args=(_free_port(), str(tmp_path)),
        nprocs=2,
        join=True,
        start_method="fork",
    )
    rank0, rank1 = (torch.load(tmp_path / f"bias{r}.pt") for r in range(2))
    assert torch.equal(rank0, rank1)
    assert torch.equal(rank0, qb_bias_after_step([exact_tokens(256)]))


def test_eval_forward_touches_nothing():
    model = TwoLayers("quantile")
    model.train()
    model(exact_tokens(32))
    update_balancing(model)
    model.train()
    model(exact_tokens(32, seed=2))
    snapshot = {name: t.clone() for name, t in model.named_buffers()}
    model.eval()
    model(exact_tokens(32, seed=3))
    for name, t in model.named_buffers():
        assert torch.equal(t, snapshot[name]), name


def test_statistics_only_in_training_and_reset_by_update():
    moe = make_moe("quantile")
    moe.eval()
    moe(exact_tokens(32))
    assert int(moe.step_loads.sum()) == 0
    assert update_balancing(moe) == {"router/moe/bias_norm": 0.0, "router/dropped_tokens": 0.0}
    moe.train()
    moe(exact_tokens(32))
    assert int(moe.step_loads.sum()) == 32 * TOP_K
    assert torch.equal(moe.step_margin_counts.sum(1), torch.full((NUM_EXPERTS,), 32))
    update_balancing(moe)
    assert int(moe.step_loads.sum()) == 0 and int(moe.step_margin_counts.sum()) == 0


def test_update_changes_routing_only_from_the_next_step():
    moe = make_moe("quantile")
    moe.train()
    x = exact_tokens(128)
    first = moe(x).detach()
    assert torch.equal(moe(x).detach(), first)  # recording statistics changes nothing
    update_balancing(moe)
    loads_before = routed_loads(make_moe("quantile"), x)
    loads_after = routed_loads(moe, x)
    assert not torch.equal(moe(x).detach(), first)
    # The new bias moves the loads toward the target k * m / E.
    target = TOP_K * 128 / NUM_EXPERTS
    assert (loads_after - target).abs().max() < (loads_before - target).abs().max()


def test_one_update_covers_every_layer_and_reports_aggregates():
    model = TwoLayers("loss_free")
    model.train()
    model(exact_tokens(64))
    metrics = update_balancing(model)
    assert [label for label, _ in moe_layers(model)] == ["0", "1"]
    per_layer = [metrics[f"router/{i}/max_load_ratio"] for i in range(2)]
    assert metrics["router/max_load_ratio"] == max(per_layer)
    assert all(metrics[f"router/{i}/bias_norm"] > 0 for i in range(2))


def test_balancing_none_keeps_bias():
    moe = make_moe("none")
    moe.train()
    moe(exact_tokens(64))
    metrics = update_balancing(moe)
    assert torch.equal(moe.bias, torch.zeros(NUM_EXPERTS))
    assert metrics["router/moe/max_load_ratio"] > 1.0
