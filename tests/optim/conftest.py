"""A tiny model built from the real layer classes, for the optimizer tests.

`TinyStack` is not a language model worth training; it holds one of each layer kind whose
parameters the optimizer rules must place (embedding, both MLA query variants, AttnRes site,
latent MoE with router and 3-D experts, dense GLU FFN, RMSNorm, untied head).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from k3scale.models.attnres import AttnResSite
from k3scale.models.common import RMSNorm
from k3scale.models.config import MLAConfig, MoEConfig
from k3scale.models.ffn import GLUFeedForward
from k3scale.models.mla import MultiHeadLatentAttention
from k3scale.models.moe import MoE

VOCAB = 32
D_MODEL = 16
EPS = 1e-5
STD = 0.1
MLA_QLORA = MLAConfig(
    num_heads=2,
    q_lora_rank=8,
    kv_lora_rank=8,
    d_nope=4,
    d_rope=2,
    d_v=4,
    rope=False,
    output_gate=True,
)
MLA_DIRECT = MLAConfig(num_heads=4, kv_lora_rank=8, d_nope=4, d_rope=2, d_v=4)
MOE = MoEConfig(num_experts=4, top_k=2, num_shared=1, d_expert=8, d_latent=8)


class TinyStack(nn.Module):
    """`forward(tokens [B, T]) -> scalar` next-token CE loss through one of each layer kind."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.attn_lora = MultiHeadLatentAttention(D_MODEL, MLA_QLORA, EPS, STD)
        self.attn_direct = MultiHeadLatentAttention(D_MODEL, MLA_DIRECT, EPS, STD)
        self.attnres = AttnResSite(D_MODEL, EPS)
        self.moe = MoE(D_MODEL, MOE, "situ", 4.0, 25.0, STD, EPS)
        self.ffn = GLUFeedForward(D_MODEL, 24, "swiglu", 4.0, None, STD)
        self.final_norm = RMSNorm(D_MODEL, EPS)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens[:, :-1])
        h = x + self.attn_lora(x) + self.attn_direct(x)
        h = self.attnres([x, h])
        h = h + self.moe(h) + self.ffn(h)
        logits = self.head(self.final_norm(h))
        return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def make_tiny_stack(seed: int = 0) -> TinyStack:
    torch.manual_seed(seed)
    return TinyStack()


def random_tokens(seed: int, batch: int = 2, seq_len: int = 9) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, seq_len), generator=gen)


@pytest.fixture
def make_stack():
    """`make_stack(seed) -> TinyStack` with seeded init."""
    return make_tiny_stack


@pytest.fixture
def make_tokens():
    """`make_tokens(seed) -> Long[2, 9]` random token windows."""
    return random_tokens
