"""runtime-proxy: a transparent CRI proxy that calls resource hooks around lifecycle calls."""
