"""Search spaces: log-uniform peak LR and power-of-two global batch sizes (sequences per step).

Ranges are centred on what Muon with RMS matching (update RMS 0.2, so Muon and AdamW share one
LR) needs at these widths, spanning about 1.5 decades of LR and 4x of batch (methods.md 2.5:
about one decade of LR and 4x of batch around a law's prediction). `lr_min` (1e-5, StepLaw's
absolute floor) sits more than 10x below `lr_low` (methods.md 1.4).
"""

from k3scale.sweep.declaration import SearchSpace

TINY_CPU = SearchSpace(lr_low=2e-3, lr_high=6e-2, batch_sizes=(8, 16, 32))
"""Models of 10^4-10^6 non-embedding parameters trained on 10^5-10^6 tokens."""

SMALL_CPU = SearchSpace(lr_low=2e-3, lr_high=6e-2, batch_sizes=(8, 16, 32))
"""The reference CPU ladder: 128-token sequences, budgets of 0.5-2 x 10^5 tokens."""

GPU = SearchSpace(lr_low=3e-4, lr_high=1e-2, batch_sizes=(64, 128, 256, 512))
"""Ladders of 10^7-10^9 active parameters on one GPU or a cluster."""
