"""k3scale.data."""
