"""The re-runs' own plumbing: which `serve` processes are put on another data path."""

import sys

from ..datapath import with_data_path


def test_a_serve_process_gets_the_data_path_wrapped_or_not() -> None:
    plain = (sys.executable, "-m", "runtimeproxy", "serve", "--listen", "p.sock")
    assert with_data_path(plain, "grpc") == (*plain[:4], "--data-path", "grpc", "--listen", "p.sock")
    wrapped = (sys.executable, "-c", "wrapper", "3", sys.executable, "-m", "runtimeproxy.cli", "serve")
    assert with_data_path(wrapped, "grpc") == (*wrapped, "--data-path", "grpc")


def test_other_processes_and_a_chosen_data_path_are_left_alone() -> None:
    for argv in (
        (sys.executable, "-m", "runtimeproxy", "serve", "--data-path", "frames"),
        (sys.executable, "-m", "runtimeproxy", "hook", "run", "noop"),
        (sys.executable, "-m", "tests.component.hookrun.testhooks", "hook", "run", "serve"),
        ("docker-registry", "serve", "config.yml"),
    ):
        assert with_data_path(argv, "grpc") == argv
