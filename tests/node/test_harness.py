"""The node tier's own pieces that need no kubelet: error normalisation, the binary cache."""

from __future__ import annotations

import hashlib
import lzma
from pathlib import Path

import pytest

from .binary import KubeletBinaryError, archive_path, unpacked_kubelet
from .crierrors import CriError, cri_error, cri_errors

PROXY_DOWN = (
    'E1130 22:11:42.021674   11983 remote_runtime.go:277] "ListPodSandbox with filter from runtime service failed" '
    'err="rpc error: code = Unavailable desc = connection error: desc = \\"transport: Error while dialing dial unix '
    '/tmp/a/proxy.sock: connect: no such file or directory\\"" filter="nil"'
)


def test_a_cri_error_keeps_file_message_and_code() -> None:
    assert cri_error(PROXY_DOWN) == CriError("remote_runtime.go", "ListPodSandbox with filter from runtime service failed",
                                             "Unavailable")


def test_runs_differing_in_time_pid_line_and_ids_normalise_alike() -> None:
    other = PROXY_DOWN.replace("22:11:42.021674   11983", "09:01:02.000001  7").replace(":277]", ":280]") \
        .replace("/tmp/a/", "/tmp/b/")
    assert cri_errors(PROXY_DOWN + "\n" + other) == {cri_error(PROXY_DOWN)}


def test_errors_of_kubelets_callers_count_by_their_grpc_status() -> None:
    line = ('E1130 22:11:42.315723   11983 prober.go:106] "Probe errored" err="rpc error: code = NotFound desc = '
            'container abc not found" probeType="Liveness"')
    assert cri_error(line) == CriError("prober.go", "Probe errored", "NotFound")


@pytest.mark.parametrize("line", [
    'E1130 22:01:13.476388   17903 server.go:1175] "Failed to set rlimit on max file handles" err="operation not permitted"',
    'I1130 22:01:13.469028   17903 remote_runtime.go:121] "Validated CRI v1 runtime API"',
    'W1130 22:01:13.469028   17903 remote_runtime.go:121] "anything" err="rpc error: code = Unknown desc = x"',
    "Flag --pod-infra-container-image has been deprecated",
])
def test_other_lines_are_not_cri_errors(line: str) -> None:
    assert cri_error(line) is None


def test_an_error_of_the_cri_client_without_a_status_still_counts() -> None:
    line = 'E1130 22:01:13.476388   17903 remote_image.go:100] "ImageStatus from image service failed" err="context deadline"'
    assert cri_error(line) == CriError("remote_image.go", "ImageStatus from image service failed", "")


def _archive(tmp_path: Path, payload: bytes) -> tuple[Path, str]:
    archive = tmp_path / "kubelet.xz"
    archive.write_bytes(lzma.compress(payload))
    return archive, hashlib.sha256(payload).hexdigest()


def test_unpacks_once_into_a_directory_named_by_its_sha256(tmp_path: Path) -> None:
    archive, sha = _archive(tmp_path, b"#!/bin/sh\n")
    binary = unpacked_kubelet(archive, tmp_path / "cache", sha)
    assert binary == tmp_path / "cache" / sha / "kubelet"
    assert binary.read_bytes() == b"#!/bin/sh\n" and binary.stat().st_mode & 0o111
    archive.unlink()  # cached: the archive is not needed again
    assert unpacked_kubelet(archive, tmp_path / "cache", sha) == binary


def test_a_damaged_cached_binary_is_unpacked_again(tmp_path: Path) -> None:
    archive, sha = _archive(tmp_path, b"kubelet")
    binary = unpacked_kubelet(archive, tmp_path / "cache", sha)
    binary.write_bytes(b"kube")  # truncated, say by a crash
    assert unpacked_kubelet(archive, tmp_path / "cache", sha).read_bytes() == b"kubelet"


def test_a_foreign_archive_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    archive, _ = _archive(tmp_path, b"not kubelet")
    with pytest.raises(KubeletBinaryError, match="expected " + "0" * 64):
        unpacked_kubelet(archive, tmp_path / "cache", "0" * 64)
    assert list((tmp_path / "cache" / ("0" * 64)).iterdir()) == []


def test_a_missing_archive_is_named(tmp_path: Path) -> None:
    with pytest.raises(KubeletBinaryError, match="no kubelet archive at"):
        unpacked_kubelet(tmp_path / "absent.xz", tmp_path / "cache")


def test_the_archive_is_found_through_runtime_proxy_shared() -> None:
    assert archive_path({"RUNTIME_PROXY_SHARED": "/x"}) == Path("/x/kubelet/kubelet-v1.26.4.xz")
