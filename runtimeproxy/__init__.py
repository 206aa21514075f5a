"""runtime-proxy: a transparent CRI proxy that calls resource hooks around lifecycle calls."""

import os

# grpc's C core, as grpcio builds it, runs handlers of its own at each fork()
# (pthread_atfork) unless this is off; uvloop, the default event loop, starts
# every child process (containerd, ctr, runc, umount) with fork(), and with
# grpc's threads busy those handlers wrote `fork_posix.cc:71] Other threads are
# currently calling into gRPC, skipping fork() handlers` raw to stderr, a line
# that breaks --log-format json. Nothing here needs them: every child execs at
# once, none calls grpc. grpc reads it as it is first set up, on its import:
# hence here, before any module of the package imports grpc. A value set
# outside wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
