"""What the balloon pool raises, in a module of its own to break an import
cycle: pool.py's Pool takes rebuilding.py's Rebuilding as a mixin, and
rebuilding.py raises Exhausted, so neither can import it from the other.
pool.py re-exports both: import them from there."""


class PoolError(RuntimeError):
    """The config cannot be laid out on this machine (too few CPUs for the reserved set or minBalloons)."""


class Exhausted(RuntimeError):
    """No balloon can take the container."""
