"""Multi-token prediction: alignment (predicts t_{i+2}), loss weighting, depth chaining."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from k3scale.models import accounting, build_model
from k3scale.models.config import K2Config, K3Config, KDAConfig, MLAConfig, MoEConfig
from k3scale.models.model import moe_modules


def k2_with_mtp(depth: int) -> K2Config:
    return K2Config(
        vocab_size=48,
        d_model=16,
        num_layers=2,
        mla=MLAConfig(num_heads=2, kv_lora_rank=8, d_nope=8, d_rope=4, d_v=8),
        d_ff_dense=24,
        moe=MoEConfig(num_experts=4, top_k=1, d_expert=8),
        mtp_depth=depth,
        mtp_lambda=0.5,
    )


def k3_with_mtp(mixer: str) -> K3Config:
    return K3Config(
        vocab_size=48,
        d_model=16,
        num_layers=4,
        kda=KDAConfig(num_heads=2, d_head=8, chunk_size=4),
        mla=MLAConfig(num_heads=2, kv_lora_rank=8, d_nope=8, d_rope=4, d_v=8, rope=False),
        d_ff_dense=24,
        attnres_block_size=2,
        mtp_depth=1,
        mtp_mixer=mixer,
    )


def test_depth_one_predicts_the_token_after_next():
    torch.manual_seed(0)
    model = build_model(k2_with_mtp(1))
    window = torch.randint(0, 48, (2, 10))  # t_0 .. t_9; the model sees t_0..t_8
    tokens, targets = window[:, :-1], window[:, 1:]
    out = model(tokens, targets=targets)
    with torch.no_grad():
        hidden = model.hidden_states(tokens)[:, :-1]  # positions i = 0..7
        block = model.mtp.blocks[0]
        h1 = block(hidden, model.embed(window[:, 1:-1]))  # Emb(t_{i+1})
        logits = model.head(model.final_norm(h1))
        expected = F.cross_entropy(logits.flatten(0, 1), window[:, 2:].flatten())  # t_{i+2}
    assert out.mtp_loss.item() == pytest.approx(expected.item(), rel=1e-6)
    aux = sum(m.aux_loss.item() for m in moe_modules(model))
    total = out.ce_loss.item() + aux + 0.5 * out.mtp_loss.item()
    assert out.loss.item() == pytest.approx(total, rel=1e-6)


def test_mtp_gradients_reach_its_projection_and_leave_main_logits_alone():
    torch.manual_seed(1)
    cfg = k2_with_mtp(2)
    model = build_model(cfg)
    window = torch.randint(0, 48, (2, 9))
    out = model(window[:, :-1], targets=window[:, 1:])
    out.loss.backward()
    for block in model.mtp.blocks:
        assert block.eh_proj.weight.grad.abs().sum() > 0
    plain = build_model(dataclasses.replace(cfg, mtp_depth=0))
    plain.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        torch.testing.assert_close(plain(window[:, :-1]).logits, out.logits.detach())


def test_depths_past_the_window_contribute_nothing():
    torch.manual_seed(2)
    model = build_model(k2_with_mtp(2))
    window = torch.randint(0, 48, (1, 3))  # T = 2: depth 1 keeps 1 position, depth 2 none
    out = model(window[:, :-1], targets=window[:, 1:])
    assert torch.isfinite(out.loss)
    one = build_model(k2_with_mtp(1))
    one.load_state_dict(model.state_dict(), strict=False)
    single = one(window[:, :-1], targets=window[:, 1:]).mtp_loss
    assert out.mtp_loss.item() == pytest.approx(single.item() / 2, rel=1e-6)


@pytest.mark.parametrize("mixer", ["kda", "mla"])
def test_k3_mtp_block_type_and_count(mixer):
    cfg = k3_with_mtp(mixer)
    model = build_model(cfg)
    assert model.mtp.blocks[0].block.kind == mixer
    assert sum(p.numel() for p in model.parameters()) == accounting.num_params_total(cfg)
    window = torch.randint(0, 48, (2, 7))
    out = model(window[:, :-1], targets=window[:, 1:])
    assert torch.isfinite(out.mtp_loss) and out.mtp_loss.item() > 0
