"""Benchmark of runtime-proxy against a private containerd: ``python -m bench``.

Modules:

* :mod:`bench.runner` -- the orchestration (containerd, proxies, hook servers,
  the phases, clean-up);
* :mod:`bench.hookcalls` -- phase 3: calls straight to the hook servers;
* :mod:`bench.leanhook` -- the lean no-op hook server on raw HTTP/2 frames;
* :mod:`bench.loadgen` -- the load-generator child process (grpc.aio, raw bytes);
* :mod:`bench.procs` -- child processes: start, readiness, CPU time, stop;
* :mod:`bench.lifecycle` -- CRI pod/container set-up and the timed pod lifecycle;
* :mod:`bench.stats` -- percentiles and summaries;
* :mod:`bench.report` -- the plain-text table and the JSON document.

See ``bench/README.md``.
"""
