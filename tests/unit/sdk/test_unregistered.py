"""A handler that no hook file written for its server's socket lists is
never called by the proxy: warned at start, naming it (hooks/unregistered.py);
a built-in hook whose HOOKS leaves one out is refused where hook run loads it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import pytest

from cri_api.hookapi import api_pb2
from hooks import builtin, unregistered
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


def warned_hooks(caplog: pytest.LogCaptureFixture, socket_path: Path) -> list[str]:
    return [r.hook for r in caplog.records  # type: ignore[attr-defined]
            if r.name == LOGGER and r.levelno == logging.WARNING and r.socket == str(socket_path)]  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def short_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unregistered, "DELAY", 0.05)


async def settled() -> None:
    """Past the check's delay, from the last write or start."""
    await asyncio.sleep(unregistered.DELAY * 4)


MESSAGE = ("CreateAndUpdate.pre_update_container_resources handles PreUpdateContainerResources, but no hook file for "
           "its socket lists it: the proxy calls only the hook points a hook file lists, so it is never called "
           "(add it to write_hook_config's hooks)")


async def test_a_handler_the_hook_file_leaves_out_is_warned_about_by_name(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with CreateAndUpdate(sock_dir / "h.sock") as server:
        assert server.handled_hooks == (HookType.PRE_CREATE_CONTAINER, HookType.PRE_UPDATE_CONTAINER_RESOURCES)
        write_hook_config(tmp_path, "h", server.socket_path, ["PreCreateContainer"])
        await settled()
        assert warnings(caplog) == [(MESSAGE, "CreateAndUpdate.pre_update_container_resources",
                                     "PreUpdateContainerResources")]
        write_hook_config(tmp_path, "h", server.socket_path, ["PreCreateContainer"])  # rewritten: once per socket
        await settled()
        assert len(warnings(caplog)) == 1


def armed(socket_path: Path) -> asyncio.TimerHandle:
    """The check to come for the server at ``socket_path``."""
    timer = unregistered._serving[os.path.abspath(socket_path)].timer
    assert timer is not None and not timer.cancelled()
    return timer


def fire(socket_path: Path) -> None:
    """Run the armed check now, as its timer would (its time come)."""
    armed(socket_path).cancel()
    unregistered._check(os.path.abspath(socket_path))


async def test_files_written_one_after_another_count_together_awaits_between_or_not(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks run by hand: a long DELAY, so a late loop cannot run one early
    (before: the second file came DELAY/2 after the first, which a loop 25 ms late missed)."""
    monkeypatch.setattr(unregistered, "DELAY", 30)
    async with CreateAndUpdate(sock_dir / "h.sock") as server, CreateAndUpdate(sock_dir / "alone.sock") as alone:
        # One file per failure policy: the second lists what the first leaves out, written a moment later.
        write_hook_config(tmp_path, "create", server.socket_path, ["PreCreateContainer"], failure_policy="Fail")
        await asyncio.sleep(0)  # the check armed again (written: call_soon_threadsafe)
        first = armed(server.socket_path)
        write_hook_config(tmp_path, "update", server.socket_path, ["PreUpdateContainerResources"])
        write_hook_config(tmp_path, "alone", alone.socket_path, ["PreCreateContainer"])  # the same, with no second file
        await asyncio.sleep(0)
        assert first.cancelled() and armed(server.socket_path) is not first  # the wait started again
        fire(server.socket_path)
        fire(alone.socket_path)
    async with CreateAndUpdate(sock_dir / "h2.sock") as server:
        write_hook_config(tmp_path, "h2", server.socket_path, server.handled_hooks)
        await asyncio.sleep(0)
        fire(server.socket_path)
    assert warned_hooks(caplog, sock_dir / "h.sock") == warned_hooks(caplog, sock_dir / "h2.sock") == []
    assert warned_hooks(caplog, sock_dir / "alone.sock") == ["PreUpdateContainerResources"]


async def test_files_written_from_threads_count_together_and_each_write_succeeds(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """write_hook_config run off the loop (asyncio.to_thread), two at once, for a server, many times over."""
    async with CreateAndUpdate(sock_dir / "alone.sock") as alone:
        for round in range(8):
            async with CreateAndUpdate(sock_dir / f"h{round}.sock") as server:
                await asyncio.gather(
                    asyncio.to_thread(write_hook_config, tmp_path, f"create{round}", server.socket_path,
                                      ["PreCreateContainer"], "Fail"),
                    asyncio.to_thread(write_hook_config, tmp_path, f"update{round}", server.socket_path,
                                      ["PreUpdateContainerResources"]),
                    asyncio.to_thread(write_hook_config, tmp_path, "alone", alone.socket_path, ["PreCreateContainer"]),
                )
                await settled()
        assert [r.hook for r in caplog.records if r.name == LOGGER] == ["PreUpdateContainerResources"]  # alone's
        assert warned_hooks(caplog, sock_dir / "alone.sock") == ["PreUpdateContainerResources"]


async def test_any_hook_file_beside_one_written_counts_hand_written_too(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with CreateAndUpdate(sock_dir / "h.sock") as server, CreateAndUpdate(sock_dir / "other.sock") as other:
        write_hook_config(tmp_path, "create", server.socket_path, ["PreCreateContainer"])
        (tmp_path / "update.json").write_text(json.dumps(  # by hand
            {"remote-endpoint": str(server.socket_path), "failure-policy": "Ignore",
             "runtime-hooks": ["PreUpdateContainerResources"]}))
        write_hook_config(tmp_path, "other", other.socket_path, ["PreCreateContainer"])
        (tmp_path / "other-by-hand.json").write_text("{not json")  # lists nothing
        await settled()
    assert warned_hooks(caplog, sock_dir / "h.sock") == []
    assert warned_hooks(caplog, sock_dir / "other.sock") == ["PreUpdateContainerResources"]


async def test_the_wait_starts_again_with_each_write(sock_dir: Path, tmp_path: Path) -> None:
    async with CreateAndUpdate(sock_dir / "h.sock") as server:
        write_hook_config(tmp_path, "create", server.socket_path, ["PreCreateContainer"])
        await asyncio.sleep(0)  # the hand-over to the loop
        first = unregistered._serving[str(server.socket_path)].timer
        assert first is not None
        write_hook_config(tmp_path, "update", server.socket_path, ["PreUpdateContainerResources"])
        await asyncio.sleep(0)
        second = unregistered._serving[str(server.socket_path)].timer
        assert second is not None and second is not first
        assert first.cancelled() and not second.cancelled() and second.when() >= first.when()


async def test_a_write_never_fails_for_the_check(
    sock_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with CreateAndUpdate(sock_dir / "h.sock") as server:
        closed = asyncio.new_event_loop()
        closed.close()
        monkeypatch.setattr(unregistered._serving[str(server.socket_path)], "loop", closed)  # served on a loop since closed
        assert write_hook_config(tmp_path, "h", server.socket_path, ["PreCreateContainer"]).exists()

    def broken(*args: object) -> None:
        raise OSError("broken")

    monkeypatch.setattr(unregistered, "_files_naming", broken)
    async with CreateAndUpdate(sock_dir / "h2.sock") as server:
        write_hook_config(tmp_path, "h2", server.socket_path, ["PreCreateContainer"])
        await settled()  # the check's failure is logged at debug, not raised in the loop
    assert warnings(caplog) == []


async def test_a_server_started_after_its_hook_file_is_checked_at_start(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_hook_config(tmp_path, "h", sock_dir / "h.sock", ["PreCreateContainer"])
    write_hook_config(tmp_path, "gone", sock_dir / "h.sock", ["PreUpdateContainerResources"])
    (tmp_path / "gone.json").unlink()  # a removed file no longer lists anything
    await settled()
    assert warnings(caplog) == []  # nothing serves there yet
    async with CreateAndUpdate(sock_dir / "h.sock"):
        await settled()
        assert [hook for _, _, hook in warnings(caplog)] == ["PreUpdateContainerResources"]


async def test_unchecked_a_server_answering_through_handle_and_a_socket_no_file_of_this_process_names(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with Generic(sock_dir / "g.sock") as generic, CreateAndUpdate(sock_dir / "h.sock"), \
            CreateAndUpdate(sock_dir / "listed.sock") as listed:
        assert generic.handled_hooks == ()
        write_hook_config(tmp_path, "g", generic.socket_path, ["PreCreateContainer"])
        write_hook_config(tmp_path, "listed", listed.socket_path, ["PreCreateContainer"])  # the control: warned
        await settled()
    assert [r.socket for r in caplog.records if r.name == LOGGER] == [str(sock_dir / "listed.sock")]


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


def test_a_server_whose_loop_ended_without_stop_is_forgotten_at_the_next_write(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: its entry stayed, holding the closed loop, and each later
    write naming its socket failed to schedule a check there, logged at
    debug as "unregistered handlers not checked" with a traceback."""
    caplog.set_level(logging.DEBUG, LOGGER)

    async def main() -> str:
        server = CreateAndUpdate(sock_dir / "h.sock")
        await server.start()  # never stopped
        return server.socket_path

    socket_path = asyncio.run(main())
    write_hook_config(tmp_path, "h", socket_path, ["PreCreateContainer"])
    write_hook_config(tmp_path, "h", socket_path, ["PreCreateContainer"])
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == []
