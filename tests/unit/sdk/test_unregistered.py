"""A handler that no hook file written for its server's socket lists is
never called by the proxy: warned at start, naming it (hooks/unregistered.py);
a built-in hook whose HOOKS leaves one out is refused where hook run loads it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from cri_api.hookapi import api_pb2
from hooks import builtin
from hooks.builtin import BuiltinHook
from hooks.handlers import handled_hooks
from hooks.sdk import HookServer, write_hook_config
from runtimeproxy.hookpath.points import HookType

LOGGER = "hooks.unregistered"


class CreateAndUpdate(HookServer):
    async def pre_create_container(self, request: api_pb2.ContainerResourceHookRequest) -> None:
        return None

    async def pre_update_container_resources(self, request: api_pb2.ContainerResourceHookRequest) -> None:
        return None


class Generic(HookServer):
    async def handle(self, hook: HookType, request: object) -> None:
        return None


def warnings(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str]]:
    return [(r.getMessage(), r.handler, r.hook) for r in caplog.records  # type: ignore[attr-defined]
            if r.name == LOGGER and r.levelno == logging.WARNING]


async def next_step() -> None:
    """The check runs once the loop's current step is done (call_soon): let it."""
    await asyncio.sleep(0)


MESSAGE = ("CreateAndUpdate.pre_update_container_resources handles PreUpdateContainerResources, but no hook file for "
           "its socket lists it: the proxy calls only the hook points a hook file lists, so it is never called "
           "(add it to write_hook_config's hooks)")


async def test_a_handler_the_hook_file_leaves_out_is_warned_about_by_name(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with CreateAndUpdate(sock_dir / "h.sock") as server:
        assert server.handled_hooks == (HookType.PRE_CREATE_CONTAINER, HookType.PRE_UPDATE_CONTAINER_RESOURCES)
        write_hook_config(tmp_path, "h", server.socket_path, ["PreCreateContainer"])
        await next_step()
        assert warnings(caplog) == [(MESSAGE, "CreateAndUpdate.pre_update_container_resources",
                                     "PreUpdateContainerResources")]
        write_hook_config(tmp_path, "h", server.socket_path, ["PreCreateContainer"])  # rewritten: once per socket
        await next_step()
        assert len(warnings(caplog)) == 1


async def test_files_written_in_one_go_count_together_and_listing_all_warns_nothing(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with CreateAndUpdate(sock_dir / "h.sock") as server:
        # One file per failure policy: the second lists what the first leaves out.
        write_hook_config(tmp_path, "create", server.socket_path, ["PreCreateContainer"], failure_policy="Fail")
        write_hook_config(tmp_path, "update", server.socket_path, ["PreUpdateContainerResources"])
        await next_step()
    async with CreateAndUpdate(sock_dir / "h2.sock") as server:
        write_hook_config(tmp_path, "h2", server.socket_path, server.handled_hooks)
        await next_step()
    assert warnings(caplog) == []


async def test_a_server_started_after_its_hook_file_is_checked_at_start(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_hook_config(tmp_path, "h", sock_dir / "h.sock", ["PreCreateContainer"])
    write_hook_config(tmp_path, "gone", sock_dir / "h.sock", ["PreUpdateContainerResources"])
    (tmp_path / "gone.json").unlink()  # a removed file no longer lists anything
    await next_step()
    assert warnings(caplog) == []  # nothing serves there yet
    async with CreateAndUpdate(sock_dir / "h.sock"):
        await next_step()
        assert [hook for _, _, hook in warnings(caplog)] == ["PreUpdateContainerResources"]


async def test_unchecked_a_server_answering_through_handle_and_a_socket_no_file_of_this_process_names(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with Generic(sock_dir / "g.sock") as generic, CreateAndUpdate(sock_dir / "h.sock"):
        assert generic.handled_hooks == ()
        write_hook_config(tmp_path, "g", generic.socket_path, ["PreCreateContainer"])
        await next_step()
    assert warnings(caplog) == []


class Partial(BuiltinHook):
    NAME, SUMMARY, HOOKS = "partial", "", (HookType.PRE_CREATE_CONTAINER,)

    async def pre_create_container(self, request: api_pb2.ContainerResourceHookRequest) -> None:
        return None

    async def pre_update_container_resources(self, request: api_pb2.ContainerResourceHookRequest) -> None:
        return None


def test_a_builtin_hook_handling_a_point_its_hooks_leave_out_is_refused_where_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(builtin, "BUILTIN_HOOKS", {"partial": f"{__name__}:Partial"})
    refused = ("built-in hook 'partial': Partial.pre_update_container_resources handles PreUpdateContainerResources, "
               "which Partial.HOOKS does not list: hook run registers only HOOKS, so the proxy would never call it")
    with pytest.raises(TypeError) as raised:
        builtin.load_builtin("partial")
    assert str(raised.value) == refused
    assert [info.unavailable for info in builtin.describe_builtins()] == [refused]  # hook list says so


def test_every_builtin_hook_lists_the_points_it_handles() -> None:
    for name in builtin.BUILTIN_HOOKS:
        try:
            cls = builtin.load_builtin(name)  # a TypeError for an unlisted handler
        except builtin.BuiltinUnavailable:
            continue  # its dependencies are not installed here
        assert builtin.unlisted_handlers(cls) == []
        assert set(handled_hooks(cls, HookServer)) <= set(cls.HOOKS)


def test_a_scripts_subclass_of_a_builtin_hook_may_handle_more() -> None:
    """A script serving its own subclass registers it with its own hook file: not hook run's HOOKS."""
    from hooks.batchresource.server import BatchResourceHook

    class Mine(BatchResourceHook):
        async def post_stop_container(self, request: api_pb2.ContainerResourceHookRequest) -> None:
            return None

    assert HookType.POST_STOP_CONTAINER not in Mine.HOOKS
    assert HookType.POST_STOP_CONTAINER in handled_hooks(Mine, HookServer)
