"""k3scale.sweep."""
