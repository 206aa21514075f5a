"""The re-runs' own plumbing: which `serve` processes are put on the frames data path."""

import sys

from .conftest import serve_on_frames


def test_a_serve_process_gets_the_frames_data_path_wrapped_or_not() -> None:
    plain = (sys.executable, "-m", "runtimeproxy", "serve", "--listen", "p.sock")
    assert serve_on_frames(plain) == (*plain[:4], "--data-path", "frames", "--listen", "p.sock")
    wrapped = (sys.executable, "-c", "wrapper", "3", sys.executable, "-m", "runtimeproxy.cli", "serve")
    assert serve_on_frames(wrapped) == (*wrapped, "--data-path", "frames")


def test_other_processes_and_a_chosen_data_path_are_left_alone() -> None:
    for argv in (
        (sys.executable, "-m", "runtimeproxy", "serve", "--data-path", "grpc"),
        (sys.executable, "-m", "runtimeproxy", "hook", "run", "noop"),
        (sys.executable, "-m", "tests.component.hookrun.testhooks", "hook", "run", "serve"),
        ("docker-registry", "serve", "config.yml"),
    ):
        assert serve_on_frames(argv) == argv
