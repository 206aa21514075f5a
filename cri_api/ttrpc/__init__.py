"""ttrpc request envelope (containerd/ttrpc v1.2.2), generated."""
