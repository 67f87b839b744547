"""k3scale.train."""
