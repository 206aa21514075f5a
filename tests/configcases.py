"""Config files that once passed check-config (0 errors) and then made serve
fail with a traceback: each is now one error, the same for both."""

from __future__ import annotations

# (the line after a first setting, a fragment of the one reason given)
SERVE_CRASHERS = [
    ("metrics-listen: 9464\n", "metrics-listen 9464: expected HOST:PORT"),
    ('metrics-listen: "localhost"\n', "metrics-listen 'localhost': expected HOST:PORT with a port from 0 to 65535"),
    ("grace-period: .inf\n", "grace-period inf: expected a number of seconds"),
    ("grace-period: .nan\n", "grace-period nan: expected a number of seconds"),
    ("serve-versions: [1, 2]\n", "serve-versions '1,2'"),  # this one crashed check-config itself
    ("max-concurrent-streams: 4294967296\n", "max-concurrent-streams 4294967296: expected a positive number, at most 2147483647"),
    ("max-recv-message-bytes: 2147483648\n", "max-recv-message-bytes 2147483648: expected a positive number of bytes, at most"),
]

# Metrics hosts no resolver knows, by their spelling alone: check-config passed
# them, and serve found them only at the metrics bind, with the proxy half started.
BAD_METRICS_HOSTS = [
    ('metrics-listen: "bad host!:9464"\n', "metrics-listen 'bad host!:9464': 'bad host!' is not an IP address or a host name"),
    ('metrics-listen: "999.0.0.1:9464"\n', "metrics-listen '999.0.0.1:9464': '999.0.0.1' is not an IP address or a host name"),
    ('metrics-listen: "*:9464"\n', "metrics-listen '*:9464': '*' is not an IP address or a host name (0.0.0.0 or [::]"),
    ('metrics-listen: "[a b]:9464"\n', "metrics-listen '[a b]:9464': 'a b' is not an IP address or a host name"),
    # A NUL in the scope: the bind's lookup failed, and naming the scope's interface raised ValueError.
    ('metrics-listen: "[fe80::1%\\0]:9464"\n',
     "metrics-listen '[fe80::1%\\x00]:9464': 'fe80::1%\\x00' is not an IP address or a host name"),
]
