"""Kimi Delta Attention core: the step-by-step reference, the chunked fast path, and gates."""

from k3scale.ops.kda.chunk import chunk_kda
from k3scale.ops.kda.gate import kda_gate_bounded, kda_gate_softplus
from k3scale.ops.kda.naive import naive_recurrent_kda

__all__ = ["chunk_kda", "kda_gate_bounded", "kda_gate_softplus", "naive_recurrent_kda"]
