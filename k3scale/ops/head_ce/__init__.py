"""Output-head cross-entropy: the plain reference (`naive.py`) and the cache-sized chunked path
the fp32 training loop uses (`chunked.py`)."""

from k3scale.ops.head_ce.chunked import head_cross_entropy
from k3scale.ops.head_ce.naive import head_cross_entropy_naive

__all__ = ["head_cross_entropy", "head_cross_entropy_naive"]
