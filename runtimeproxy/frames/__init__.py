"""A frame-level HTTP/2 data path (``--data-path frames``), see connection.py."""
