"""k3scale.viz."""
