"""k3scale.scaling."""
