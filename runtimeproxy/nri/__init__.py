"""``runtime-proxy nri``: the proxy's hook path behind an NRI plugin (containerd 1.7+)."""
