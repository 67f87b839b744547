"""k3scale: scaling-law studies of K2-style and K3-style language models."""
