"""Benchmarks behind `k3scale bench`: each prints ratios measured side by side in one run."""
