"""k3scale.optim."""
