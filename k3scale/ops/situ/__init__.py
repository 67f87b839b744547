"""SiTU-GLU (architecture.md section 6)."""

from k3scale.ops.situ.naive import situ, situ_glu, swiglu

__all__ = ["situ", "situ_glu", "swiglu"]
