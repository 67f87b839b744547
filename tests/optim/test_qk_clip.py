"""QK-Clip (architecture.md 8.2) on real MLA modules: caps, isolation, exact logit scaling."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from k3scale.models.config import MLAConfig
from k3scale.models.mla import MultiHeadLatentAttention, attention_logits
from k3scale.optim.qk_clip import qk_clip

D_MODEL = 24
K2 = MLAConfig(num_heads=6, q_lora_rank=16, kv_lora_rank=12, d_nope=8, d_rope=4, d_v=6)
K3 = dataclasses.replace(K2, rope=False, output_gate=True)
VARIANTS = {
    "k2_qlora": K2,
    "k2_direct_q": dataclasses.replace(K2, q_lora_rank=None),
    "k3_qlora": K3,
    "k3_no_tail": dataclasses.replace(K3, d_rope=0, q_lora_rank=None),
}
# The module's max-logit pass runs in fp32 even for an fp64 module, so gamma = tau / S carries
# fp32 rounding of S (relative ~1e-7); the cap holds to tau (1 + 1e-6) (architecture.md 8.2).
CAP_SLACK = 1e-6
# fp64 weights: gamma_h * old logits vs logits from sqrt(gamma)-rescaled weights.
FP64_TOL = 1e-12


def make_mla(cfg: MLAConfig, seed: int = 0) -> MultiHeadLatentAttention:
    torch.manual_seed(seed)
    # Large init so logits reach tens to hundreds and a threshold splits the heads.
    module = MultiHeadLatentAttention(D_MODEL, cfg, rms_eps=1e-5, init_std=0.5).double()
    module.track_max_logits = True
    return module


def random_input(seed: int = 1, seq_len: int = 11) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, seq_len, D_MODEL, generator=gen, dtype=torch.float64)


def head_rows(cfg: MLAConfig, head: int) -> tuple[slice, slice, slice]:
    """Rows of head h: q weight, kv_b k-nope, kv_b v."""
    d_qk, d_kv = cfg.d_nope + cfg.d_rope, cfg.d_nope + cfg.d_v
    q = slice(head * d_qk, (head + 1) * d_qk)
    k_nope = slice(head * d_kv, head * d_kv + cfg.d_nope)
    v = slice(head * d_kv + cfg.d_nope, (head + 1) * d_kv)
    return q, k_nope, v


def q_weight(module: MultiHeadLatentAttention) -> torch.Tensor:
    return module.q_proj.weight if module.cfg.q_lora_rank is None else module.q_b_proj.weight


@pytest.mark.parametrize("variant", VARIANTS)
def test_qk_clip_caps_clipped_heads_and_leaves_the_rest(variant):
    cfg = VARIANTS[variant]
    module, x = make_mla(cfg), random_input()
    old_logits = attention_logits(module, x)
    module(x)
    recorded = module.max_logits.float()  # what qk_clip reads (fp32 max-logit pass)
    head_max = old_logits.amax(dim=(0, 2, 3))
    ranked = head_max.sort().values
    half = cfg.num_heads // 2
    tau = ((ranked[half - 1] + ranked[half]) / 2).item()  # half the heads exceed it, none equal
    clipped = head_max > tau
    before = {name: p.detach().clone() for name, p in module.named_parameters()}

    stats = qk_clip(module, tau)

    assert stats["qk_clip/num_clipped"] == int(clipped.sum()) > 0
    assert stats["qk_clip/max_logit"] == pytest.approx(head_max.max().item(), rel=1e-6)
    assert torch.isneginf(module.max_logits).all()
    new_logits = attention_logits(module, x)
    assert (new_logits.amax(dim=(0, 2, 3)) <= tau * (1 + CAP_SLACK)).all()
    gamma = torch.where(recorded > tau, tau / recorded, torch.ones_like(recorded)).double()
    finite = torch.isfinite(old_logits)
    expected = gamma[None, :, None, None] * old_logits
    assert torch.allclose(new_logits[finite], expected[finite], rtol=FP64_TOL, atol=0)
    after = dict(module.named_parameters())
    for head in range(cfg.num_heads):
        q_rows, k_rows, v_rows = head_rows(cfg, head)
        assert torch.equal(after["kv_b_proj.weight"][v_rows], before["kv_b_proj.weight"][v_rows])
        same = torch.equal(q_weight(module)[q_rows], before[q_name(module)][q_rows])
        same_k = torch.equal(after["kv_b_proj.weight"][k_rows], before["kv_b_proj.weight"][k_rows])
        assert same == same_k == (not clipped[head]), head
    for name in before:
        if name not in (q_name(module), "kv_b_proj.weight"):
            assert torch.equal(after[name], before[name]), name


def q_name(module: MultiHeadLatentAttention) -> str:
    return "q_proj.weight" if module.cfg.q_lora_rank is None else "q_b_proj.weight"


def test_nothing_recorded_means_nothing_clipped():
    module = make_mla(K3)
    before = q_weight(module).detach().clone()
    stats = qk_clip(module, tau=1e-3)
    assert stats == {"qk_clip/num_clipped": 0}
    assert torch.equal(q_weight(module), before)


def test_no_heads_above_tau_leaves_weights_bitwise(make_stack, make_tokens):
    model = make_stack()
    for module in (model.attn_lora, model.attn_direct):
        module.track_max_logits = True
    model(make_tokens(0))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stats = qk_clip(model, tau=1e9)
    assert stats["qk_clip/num_clipped"] == 0
    assert {"qk_clip/attn_lora/max_logit", "qk_clip/attn_direct/max_logit"} <= set(stats)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert stats["qk_clip/max_logit"] == max(
        stats["qk_clip/attn_lora/max_logit"], stats["qk_clip/attn_direct/max_logit"]
    )


def test_bad_tau_is_rejected():
    with pytest.raises(ValueError, match="tau"):
        qk_clip(make_mla(K2), tau=0.0)


def clip_on_rank(rank: int, world_size: int, init_file: str, results) -> None:
    """Each rank sees a different batch; QK-Clip must use the global per-head max."""
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        module = make_mla(K2)
        module(random_input(seed=10 + rank))
        local_max = module.max_logits.clone()
        stats = qk_clip(module, tau=12.0)
        results[rank] = (local_max, q_weight(module).detach().clone(), stats)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # spawns two processes (~20 s on a loaded 2-core machine)
def test_all_reduce_max_across_ranks(tmp_path):
    results = mp.Manager().dict()
    mp.spawn(clip_on_rank, args=(2, str(tmp_path / "rendezvous"), results), nprocs=2)
    (max0, q0, stats0), (max1, q1, stats1) = results[0], results[1]
    assert not torch.equal(max0, max1)  # the ranks really saw different logits
    assert torch.equal(q0, q1)  # ... yet clip the same heads by the same factors
    global_max = torch.maximum(max0, max1)
    assert stats0 == stats1
    assert stats0["qk_clip/num_clipped"] == int((global_max > 12.0).sum()) > 0
    reference = make_mla(K2)  # same seed: identical starting weights
    reference.max_logits.copy_(global_max)
    qk_clip(reference, tau=12.0)
    assert torch.equal(q_weight(reference).detach(), q0)
