"""Attention Residuals (Kimi Team, arXiv 2603.15031; architecture.md section 4).

Each sublayer input is a softmax mixture over earlier depth "sources":
`AR(V; w, gamma) = sum_j p_j V_j`, `p = softmax_j(<w * gamma, RMSNorm(V_j)>)`, with a learned
input-independent pseudo-query `w` per site, RMS-normalised keys, unnormalised values, fp32 math
and no logit scale. K3 uses the Block variant: sublayer outputs are summed within blocks of
`block_size` decoder layers and the sources are `[embedding, completed block sums..., partial sum]`.

`BlockAttnResState` is the K3 dataflow of section 4.2 for one forward pass. The assembly owns the
sites (`AttnResSite`, e.g. two per decoder layer plus one before the final norm) and the switch to
plain residuals; per layer it calls:

    state = BlockAttnResState(embedding, block_size)
    for i, layer in enumerate(layers):
        a = layer.mixer(layer.norm_in(state.mixer_input(i, layer.mixer_site)))
        state.add_mixer_output(i, a)
        f = layer.ffn(layer.norm_post(state.ffn_input(i, layer.ffn_site)))
        state.add_ffn_output(f)
    h = state.output(output_site)
"""

from __future__ import annotations

import torch
from torch import nn

from k3scale.ops.attnres.fused import attn_res_fused, fused_supported


def depth_weights(
    sources: list[torch.Tensor], query: torch.Tensor, key_norm_weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Softmax-over-depth weights `p_j = softmax_j(<query * key_norm_weight, RMSNorm(V_j)>)`.

    Args:
        sources: Non-empty list of `[B, T, d]` tensors (same shape and dtype).
        query: `[d]` pseudo-query `w`.
        key_norm_weight: `[d]` key RMSNorm weight `gamma`.
        eps: RMSNorm epsilon of the keys.

    Returns:
        `[N, B, T]` weights summing to 1 over the N sources, in fp32 (fp64 stays fp64).
    """
    return _weights_of(_stack_values(sources), query, key_norm_weight, eps)


def attn_res(
    sources: list[torch.Tensor], query: torch.Tensor, key_norm_weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Softmax-over-depth mixture `sum_j p_j V_j` of the unnormalised sources.

    Args:
        sources: Non-empty list of `[B, T, d]` tensors (same shape and dtype).
        query: `[d]` pseudo-query `w`.
        key_norm_weight: `[d]` key RMSNorm weight `gamma`.
        eps: RMSNorm epsilon of the keys.

    Returns:
        `[B, T, d]` in the sources' dtype; computed in fp32 (fp64 stays fp64).
    """
    values = _stack_values(sources)
    weights = _weights_of(values, query, key_norm_weight, eps)
    mixed = (weights[..., None] * values).sum(dim=0)
    return mixed.to(sources[0].dtype)


def _stack_values(sources: list[torch.Tensor]) -> torch.Tensor:
    """`[N, B, T, d]` in at least fp32."""
    if not sources:
        raise ValueError("sources: need at least one source")
    return torch.stack(sources).to(torch.promote_types(sources[0].dtype, torch.float32))


def _weights_of(
    values: torch.Tensor, query: torch.Tensor, key_norm_weight: torch.Tensor, eps: float
) -> torch.Tensor:
    keys = values * torch.rsqrt(values.pow(2).mean(dim=-1, keepdim=True) + eps)
    # No logit scale: fla's naive_attnres uses scale=1.0 (architecture.md 4.1).
    scores = keys @ (query.to(values.dtype) * key_norm_weight.to(values.dtype))  # [N, B, T]
    return scores.softmax(dim=0)


class AttnResSite(nn.Module):
    """One AttnRes site: 1-D `query` (zeros, so the mixture starts as the mean) and `key_norm`.

    Both are vectors so the optimizer's 1-D rule puts them in AdamW without weight decay. With
    `fused` (the "cpu" backend) the mixture runs on the C++ kernel of ops/attnres where it can
    (CPU, fp32/fp64, no autocast); the torch code here is its reference.
    """

    def __init__(self, d_model: int, eps: float, fused: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.fused = fused
        self.query = nn.Parameter(torch.zeros(d_model))
        self.key_norm = nn.Parameter(torch.ones(d_model))

    def forward(self, sources: list[torch.Tensor]) -> torch.Tensor:
        """`attn_res(sources, query, key_norm, eps)`: list of `[B, T, d]` -> `[B, T, d]`."""
        if self.fused and fused_supported(sources, self.query):
            return attn_res_fused(sources, self.query, self.key_norm, self.eps)
        return attn_res(sources, self.query, self.key_norm, self.eps)


_CALL_ORDER = ("mixer_input", "add_mixer_output", "ffn_input", "add_ffn_output")


class BlockAttnResState:
    """Block-AttnRes bookkeeping for one forward pass (architecture.md 4.2).

    Holds the completed block sums and the running partial sum of the current block. Input
    methods read the state; `add_*` methods update it. Layers must be visited in order
    0, 1, ..., each as mixer_input -> add_mixer_output -> ffn_input -> add_ffn_output (a wrong
    order raises ValueError).

    Attributes:
        source_counts: Number of sources each site saw, `{"mixer": [per layer], "ffn": [per
            layer], "output": [n]}`; layer 0's mixer sees the raw embedding (1 source).
    """

    def __init__(self, embedding: torch.Tensor, block_size: int) -> None:
        """Args: embedding `[B, T, d]` token embeddings; block_size decoder layers per block."""
        if block_size < 1:
            raise ValueError(f"block_size: must be >= 1, got {block_size}")
        self.block_size = block_size
        self.blocks: list[torch.Tensor] = []
        self.partial: torch.Tensor = embedding
        self.source_counts: dict[str, list[int]] = {"mixer": [], "ffn": [], "output": []}
        self._calls = 0  # method calls so far; each layer makes exactly 4, in _CALL_ORDER

    def _advance(self, call: str, layer_idx: int | None) -> None:
        layer, position = divmod(self._calls, len(_CALL_ORDER))
        expected = _CALL_ORDER[position]
        if call != expected or (layer_idx is not None and layer_idx != layer):
            raise ValueError(
                f"BlockAttnResState: expected {expected}(layer_idx={layer}), "
                f"got {call}(layer_idx={layer_idx})"
            )
        self._calls += 1

    def _sources(self) -> list[torch.Tensor]:
        return [*self.blocks, self.partial]

    def mixer_input(self, layer_idx: int, site: AttnResSite) -> torch.Tensor:
        """Input of layer `layer_idx`'s mixer (before its pre-norm): `[B, T, d]`."""
        self._advance("mixer_input", layer_idx)
        sources = self._sources()
        self.source_counts["mixer"].append(len(sources))
        # Layer 0 sees the raw embedding: a one-source mixture would be the identity anyway.
        return self.partial if not self.blocks else site(sources)

    def add_mixer_output(self, layer_idx: int, mixer_output: torch.Tensor) -> None:
        """Add the mixer output; a layer at a block boundary first closes the previous block."""
        self._advance("add_mixer_output", layer_idx)
        if layer_idx % self.block_size == 0:
            self.blocks.append(self.partial)
            self.partial = mixer_output
        else:
            self.partial = self.partial + mixer_output

    def ffn_input(self, layer_idx: int, site: AttnResSite) -> torch.Tensor:
        """Input of layer `layer_idx`'s FFN (before its pre-norm): `[B, T, d]`."""
        self._advance("ffn_input", layer_idx)
        sources = self._sources()
        self.source_counts["ffn"].append(len(sources))
        return site(sources)

    def add_ffn_output(self, ffn_output: torch.Tensor) -> None:
        """Add the current layer's FFN output to the partial sum; the layer is done."""
        self._advance("add_ffn_output", None)
        self.partial = self.partial + ffn_output

    def output(self, site: AttnResSite) -> torch.Tensor:
        """Hidden state before the final norm, after the last layer: `[B, T, d]`."""
        if self._calls % len(_CALL_ORDER) != 0:
            raise ValueError("BlockAttnResState: output() called in the middle of a layer")
        sources = self._sources()
        self.source_counts["output"].append(len(sources))
        return site(sources)
