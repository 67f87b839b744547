"""Causal attention on the fused C++ kernel for narrow heads (`causal.py`)."""
