"""k3scale.ops."""
