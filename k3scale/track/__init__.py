"""k3scale.track."""
