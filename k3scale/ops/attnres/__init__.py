"""Attention Residuals on the fused C++ kernel (`fused.py`); the reference is models/attnres.py."""
