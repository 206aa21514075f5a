"""What the balloon pool raises."""


class PoolError(RuntimeError):
    """The config cannot be laid out on this machine (too few CPUs for the reserved set or minBalloons)."""


class Exhausted(RuntimeError):
    """No balloon can take the container."""
