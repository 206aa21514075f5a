"""What hooks need to know about pods and containers, by id.

Records are the hook requests themselves (as in Koordinator): a pod is kept as
the ``PodSandboxHookRequest`` its RunPodSandbox produced, a container as the
``ContainerResourceHookRequest`` of its CreateContainer. They are written
after successful calls and dropped on Remove*. A record that is missing (the
proxy restarted, or the container was created while it was down) is read back
from the backend: its status with ``verbose`` carries the original config.
Records of objects the backend no longer lists (removed past the proxy, or
by a removal whose answer was lost) are dropped by the rebuild after a
runtime restart, by a recheck of that removal, and by a periodic listing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import empty_pb2, json_format
from google.protobuf.message import DecodeError, Message

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1

from ..cripath.unknownfields import unknown_fields
from .merge import copy_as_wire, env_map, merge_resources
from .runtimespec import cgroup_parent_from_spec, resources_from_spec

log = logging.getLogger(__name__)

WIRE_LENGTH_DELIMITED = 2
# When the proxy did not see how a removal ended, the runtime is asked again
# after each of these delays (seconds) until it says the object is gone.
RECHECK_DELAYS_S = (0.5, 2.0, 10.0)
ABSENT_KEPT = 1024  # ids the runtime said it lacks, remembered (see said_absent)

# Calls a RuntimeService method on the backend: (method name, request) -> response bytes.
BackendCall = Callable[[str, bytes], Awaitable[bytes]]


def pod_record(config: v1.PodSandboxConfig, runtime_handler: str = "") -> hookapi.PodSandboxHookRequest:
    linux = config.linux
    record = hookapi.PodSandboxHookRequest(runtime_handler=runtime_handler, cgroup_parent=linux.cgroup_parent)
    copy_as_wire(record.pod_meta, config.metadata)
    record.labels.update(config.labels)
    record.annotations.update(config.annotations)
    copy_as_wire(record.overhead, linux.overhead)
    copy_as_wire(record.resources, linux.resources)
    return record


def container_record(
    pod: hookapi.PodSandboxHookRequest, config: v1.ContainerConfig, container_id: str = ""
) -> hookapi.ContainerResourceHookRequest:
    meta = config.metadata
    record = hookapi.ContainerResourceHookRequest(
        pod_meta=pod.pod_meta,
        container_meta=hookapi.ContainerMetadata(name=meta.name, attempt=meta.attempt, id=container_id),
        pod_resources=pod.resources,
        pod_cgroup_parent=pod.cgroup_parent,
        container_envs=env_map(config.envs),
    )
    record.container_annotations.update(config.annotations)
    copy_as_wire(record.container_resources, config.linux.resources)
    record.pod_annotations.update(pod.annotations)
    record.pod_labels.update(pod.labels)
    return record


@dataclass
class StateStore:
    read_backend: BackendCall | None = None
    pods: dict[str, hookapi.PodSandboxHookRequest] = field(default_factory=dict)
    containers: dict[str, hookapi.ContainerResourceHookRequest] = field(default_factory=dict)
    container_pod: dict[str, str] = field(default_factory=dict)
    # Ids with a backend read under way, and those of them changed meanwhile
    # (written, updated or removed): such a read is older than what the proxy
    # saw, so it must neither overwrite a record nor bring a removed one back.
    _reading: dict[str, int] = field(default_factory=dict)
    _stale_reads: set[str] = field(default_factory=set)
    # Per listing under way (rebuild, resync): the ids written or dropped
    # since it began, which its (older) listing must not judge.
    _listings: list[set[str]] = field(default_factory=list)
    _forgotten: int = 0  # how many times every record was dropped (``forget_all``)
    # Ids the runtime last said it does not have (NOT_FOUND on a read back),
    # the oldest forgotten past ABSENT_KEPT: a call on one is the runtime's to refuse.
    _absent: dict[str, None] = field(default_factory=dict)

    def changed(self, object_id: str) -> None:
        """A call changed this object: reads under way for it are out of date."""
        self._absent.pop(object_id, None)
        if object_id in self._reading:
            self._stale_reads.add(object_id)
        for touched in self._listings:
            touched.add(object_id)

    def put_pod(self, pod_id: str, record: hookapi.PodSandboxHookRequest) -> None:
        self.pods[pod_id] = record
        self.changed(pod_id)

    def put_container(self, container_id: str, pod_id: str, record: hookapi.ContainerResourceHookRequest) -> None:
        self.containers[container_id] = record
        self.container_pod[container_id] = pod_id
        self.changed(container_id)

    def drop_container(self, container_id: str) -> None:
        self.containers.pop(container_id, None)
        self.container_pod.pop(container_id, None)
        self.changed(container_id)

    def drop_pod(self, pod_id: str) -> None:
        # Removing a sandbox removes its containers too.
        self.pods.pop(pod_id, None)
        self.changed(pod_id)
        for cid in [c for c, p in self.container_pod.items() if p == pod_id]:
            self.drop_container(cid)

    def forget_all(self) -> None:
        """Drop every record (they may be out of date): each is read back from
        the backend when next needed, or by a rebuild. Reads under way are
        older than this, and are dropped when they end."""
        self._stale_reads.update(self._reading)
        self._forgotten += 1  # a rebuild under way reads no more
        for touched in self._listings:
            touched.update(self.pods, self.containers)
        self.pods.clear()
        self.containers.clear()
        self.container_pod.clear()

    async def rebuild_quietly(self) -> None:
        """``rebuild``, logging a failure instead of raising it: the store also reads on demand."""
        try:
            await self.rebuild()
        except Exception as exc:
            log.warning("state rebuild failed; records will be read on demand", extra={"error": str(exc)})

    async def pod(self, pod_id: str) -> hookapi.PodSandboxHookRequest | None:
        record = self.pods.get(pod_id)
        if record is None and self.read_backend is not None:
            record = await self._read(self._read_pod, pod_id)
            if record is None:
                return self.pods.get(pod_id)  # what a call wrote meanwhile, if any
            self.put_pod(pod_id, record)
        return record

    async def container(self, container_id: str) -> hookapi.ContainerResourceHookRequest | None:
        record = self.containers.get(container_id)
        if record is None and self.read_backend is not None:
            found = await self._read(self._read_container, container_id)
            if found is None:
                return self.containers.get(container_id)  # what a call wrote meanwhile, if any
            pod_id, record = found
            self.put_container(container_id, pod_id, record)
        return record

    def said_absent(self, object_id: str) -> bool:
        """Whether the runtime, read back, last said it has no such object."""
        return object_id in self._absent

    async def _read(self, reader: Callable[[str], Awaitable[Any]], object_id: str) -> Any:
        """A record read back from the backend, or None. Unknown ids are the
        backend's to report (on the call itself); a failed read only means
        hooks have less to go on."""
        self._reading[object_id] = self._reading.get(object_id, 0) + 1
        try:
            result = await reader(object_id)
        except grpc.aio.AioRpcError as err:
            log.info("cannot read state from backend", extra={"id": object_id, "code": err.code().name})
            if err.code() == grpc.StatusCode.NOT_FOUND:
                self._absent[object_id] = None
                if len(self._absent) > ABSENT_KEPT:
                    del self._absent[next(iter(self._absent))]
            result = None
        except Exception as exc:  # a garbled answer must not fail the client's call
            log.warning("cannot read state from backend", extra={"id": object_id, "error": repr(exc)})
            result = None
        finally:
            left = self._reading.pop(object_id) - 1
            stale = object_id in self._stale_reads
            if left:
                self._reading[object_id] = left
            else:
                self._stale_reads.discard(object_id)
        return None if stale else result

    async def rebuild(self) -> None:
        """Make the records what the backend has (proxy start-up, and after a
        runtime restart).

        Object by object: one the proxy cannot read (say, a label that is not
        UTF-8, which containerd accepts and Python's protobuf refuses) is
        logged and skipped, and the others are still rebuilt. Records of
        objects the backend no longer lists are dropped (a removal whose
        answer was lost when the runtime died), unless a call wrote them
        since the rebuild began."""

        forgotten = self._forgotten

        async def read_all(pod_ids: list[str], container_ids: list[str]) -> None:
            for pod_id in pod_ids:
                if self._forgotten != forgotten:
                    return
                await self.pod(pod_id)
            for container_id in container_ids:
                if self._forgotten != forgotten:
                    return
                await self.container(container_id)

        pod_ids, container_ids, gone_pods, gone_containers = await self._listing(read_all)
        log.info(
            "state rebuilt from backend",
            extra={
                "pods": len(self.pods),
                "containers": len(self.containers),
                "pods_skipped": len(pod_ids) - sum(i in self.pods for i in pod_ids),
                "containers_skipped": len(container_ids) - sum(i in self.containers for i in container_ids),
                "pods_forgotten": len(gone_pods),
                "containers_forgotten": len(gone_containers),
            },
        )

    async def forget_unlisted(self) -> None:
        """Drop the records of objects the backend no longer lists: those a
        client removed past the proxy (crictl on the runtime's own socket),
        after the proxy had read them back."""
        _, _, gone_pods, gone_containers = await self._listing(None)
        if gone_pods or gone_containers:
            log.info(
                "records of objects the runtime no longer lists dropped",
                extra={"pods": sorted(gone_pods), "containers": sorted(gone_containers)},
            )

    async def resync_every(self, interval: float, connected: Callable[[], bool]) -> None:
        """``forget_unlisted`` every ``interval`` seconds while the backend is
        ``connected`` (a service: runs until cancelled). Nothing else tells
        the proxy of removals that bypass it, and their records would pile up."""
        while True:
            await asyncio.sleep(interval)
            if not connected():
                continue  # the rebuild after the runtime returns does the same
            try:
                await self.forget_unlisted()
            except grpc.aio.AioRpcError as err:
                log.info("state resync skipped: runtime did not list", extra={"code": err.code().name})
            except Exception as exc:  # a garbled list: this resync is lost, not the next ones
                log.warning("state resync failed", extra={"error": repr(exc)})

    async def _listing(
        self, read: Callable[[list[str], list[str]], Awaitable[None]] | None
    ) -> tuple[list[str], list[str], set[str], set[str]]:
        """List the backend's pods and containers (and ``read`` them), then
        drop the records of those it does not list, unless a call wrote or
        dropped them since the listing began: such a record is newer than it."""
        assert self.read_backend is not None
        touched: set[str] = set()
        self._listings.append(touched)
        try:
            pods_before, containers_before = set(self.pods), set(self.containers)
            pod_ids = _listed_ids(await self.read_backend("ListPodSandbox", b""), v1.PodSandbox)
            container_ids = _listed_ids(await self.read_backend("ListContainers", b""), v1.Container)
            if read is not None:
                await read(pod_ids, container_ids)
            gone_containers = containers_before - set(container_ids) - touched
            gone_pods = pods_before - set(pod_ids) - touched
        finally:
            self._listings.remove(touched)
        for container_id in gone_containers:
            self.drop_container(container_id)
        for pod_id in gone_pods:
            self.drop_pod(pod_id)
        return pod_ids, container_ids, gone_pods, gone_containers

    async def forget_if_gone(self, kind: str, object_id: str) -> None:
        """A removal whose outcome the proxy did not see (its client left, the
        runtime failed or went away): the record goes once the runtime says the
        object is gone; it stays if the runtime still has it after the last try."""
        assert self.read_backend is not None
        request: Message
        if kind == "pod":
            method, request = "PodSandboxStatus", v1.PodSandboxStatusRequest(pod_sandbox_id=object_id)
        else:
            method, request = "ContainerStatus", v1.ContainerStatusRequest(container_id=object_id)
        for delay in RECHECK_DELAYS_S:
            await asyncio.sleep(delay)  # the runtime may still be removing it
            if (self.pods if kind == "pod" else self.containers).get(object_id) is None:
                return  # gone from the records meanwhile
            try:
                await self.read_backend(method, request.SerializeToString())
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    (self.drop_pod if kind == "pod" else self.drop_container)(object_id)
                    log.info("record of a removed object dropped", extra={"kind": kind, "id": object_id})
                    return

    async def _read_pod(self, pod_id: str) -> hookapi.PodSandboxHookRequest | None:
        assert self.read_backend is not None
        request = v1.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True).SerializeToString()
        status = v1.PodSandboxStatusResponse.FromString(await self.read_backend("PodSandboxStatus", request))
        info = verbose_info(status.info)
        config = config_from_info(info, v1.PodSandboxConfig())
        if info is None or config is None:
            # Not containerd's verbose format: better no record than one that
            # tells hooks wrong labels.
            log.warning("no config in sandbox status; cannot rebuild pod state", extra={"pod_sandbox_id": pod_id})
            return None
        return pod_record(config, str(info.get("runtimeHandler", "")))

    async def _read_container(self, container_id: str) -> tuple[str, hookapi.ContainerResourceHookRequest] | None:
        assert self.read_backend is not None
        request = v1.ContainerStatusRequest(container_id=container_id, verbose=True).SerializeToString()
        status = v1.ContainerStatusResponse.FromString(await self.read_backend("ContainerStatus", request))
        info = verbose_info(status.info)
        pod_id = str(info.get("sandboxID", "")) if info else ""
        pod = await self.pod(pod_id) if pod_id else None
        config = config_from_info(info, v1.ContainerConfig())
        if info is None or pod is None or config is None:
            log.warning(
                "cannot rebuild container state from the backend",
                extra={"container_id": container_id, "pod_sandbox_id": pod_id},
            )
            return None
        record = container_record(pod, config, container_id)
        spec = info.get("runtimeSpec")
        # The config is as created; the runtime spec has what later
        # UpdateContainerResources calls made of it, and the cgroup parent a
        # PreCreateContainer hook may have moved the container to.
        merge_resources(record.container_resources, resources_from_spec(spec))
        record.pod_cgroup_parent = cgroup_parent_from_spec(spec, container_id, pod.cgroup_parent)
        return pod_id, record


def _listed_ids(raw: bytes, item_type: type[v1.PodSandbox] | type[v1.Container]) -> list[str]:
    """The ids in a ListPodSandbox or ListContainers answer, item by item.

    Both lists are field 1 of their response and the id is field 1 of each
    item, so the items are split on the wire and each is read on its own:
    one item that does not decode costs only itself."""
    ids: list[str] = []
    for entry in unknown_fields(empty_pb2.Empty.FromString(raw)):
        if entry.field_number != 1 or entry.wire_type != WIRE_LENGTH_DELIMITED:
            continue
        item = entry.data
        try:
            ids.append(item_type.FromString(item).id)
        except DecodeError as exc:
            object_id = _raw_id(item)
            log.warning(
                "cannot read an item of the backend's list; its own status read decides whether it is usable",
                extra={"kind": item_type.__name__, "id": object_id, "error": str(exc)},
            )
            if object_id:
                ids.append(object_id)  # its own status read decides (and logs) whether it is usable
    return ids


def _raw_id(item: bytes) -> str:
    for entry in unknown_fields(empty_pb2.Empty.FromString(item)):
        if entry.field_number == 1 and entry.wire_type == WIRE_LENGTH_DELIMITED:
            return entry.data.decode("utf-8", "replace")
    return ""


def verbose_info(info: Any) -> dict[str, Any] | None:
    """The JSON document of a verbose status's ``info["info"]`` (containerd's:
    ``config``, ``runtimeSpec``, ``sandboxID``...); None when there is none."""
    raw = info.get("info") if info else None
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def config_from_info(info: dict[str, Any] | None, message: Any) -> Any:
    """containerd stores the request's config as Go JSON (proto field names,
    enums as numbers, env values as plain strings)."""
    if not info or not isinstance(info.get("config"), dict):
        return None
    doc = dict(info["config"])
    envs = doc.pop("envs", None) or []
    try:
        json_format.ParseDict(doc, message, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        log.warning("cannot read config from status", extra={"error": str(exc)})
        return None
    if isinstance(message, v1.ContainerConfig):
        for env in envs:
            if isinstance(env, dict):
                message.envs.add(key=str(env.get("key", "")), value=str(env.get("value", "")).encode())
    return message
