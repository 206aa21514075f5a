"""The runtime-proxy command's entry point (the console script and
python -m runtimeproxy): the process's settings that must come before grpc is
imported, then the CLI."""

import os

# grpc's C core, as grpcio builds it, runs handlers of its own at each fork()
# (pthread_atfork) unless this is off; uvloop, the default event loop, starts
# every child process (containerd, ctr, runc, umount) with fork(), and with
# grpc's threads busy those handlers wrote `fork_posix.cc:71] Other threads are
# currently calling into gRPC, skipping fork() handlers` raw to stderr, a line
# that breaks --log-format json. Nothing here needs them: every child execs at
# once, none calls grpc. grpc reads it once, on its first import: hence here,
# before the CLI (which imports grpc) and only for the command, not for a
# library user of the package nor, through the environment, every child of
# theirs. A value set outside wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from .cli import main  # after the setting above, on purpose

__all__ = ["main"]
