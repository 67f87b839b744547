"""Routed-expert computation (architecture.md section 5): a dense masked reference (`naive.py`)
and the sorted dispatch used by the model (`dispatch.py`)."""

from k3scale.ops.moe.dispatch import routed_experts
from k3scale.ops.moe.naive import routed_experts_naive

__all__ = ["routed_experts", "routed_experts_naive"]
