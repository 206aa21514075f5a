"""NRI v0.4.0 API (containerd/nri), generated."""
