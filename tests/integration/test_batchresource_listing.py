"""batchresource learns a BE pod from the runtime's listing: one made while no
hook was asked (the hook down, the proxy going on without it), then the hook
started; values read where they land, in /sys/fs/cgroup."""

from __future__ import annotations

import json

from hooks.batchresource.learn import LEARNED, UNTOLD
from hooks.batchresource.server import BatchResourceHook
from hooks.registration import write_hook_config

from ..filewatch import until_on_disk
from ..hookprocs import registered
from .batchhelpers import HookRun, batchresource_hook
from .proxyfixtures import ProxyLauncher
from .test_batchresource import BE, MIB, Pod, batch, container_values, pod, pod_values, spec, start_container

BE_VALUES = (512, 50000, 128 * MIB)


async def written(hook: HookRun, p: Pod, pid: int) -> None:
    """Wait for the listing's last write for ``p``: its pod cgroup's memory
    limit lowered, logged after the container's values and the pod's raise;
    then every value holds."""
    pod_name = f"{p.config.metadata.namespace}/{p.config.metadata.name}"
    await hook.logged(lambda line: line.get("msg") == "batchresource set a pod cgroup value" and line.get("pod") == pod_name
                      and line.get("from") == "runtime listing" and line.get("field") == "memory_limit", timeout=20.0)
    assert (container_values(pid), pod_values(p.cgroup)) == (BE_VALUES, BE_VALUES)


async def test_a_be_pod_made_with_no_hook_gets_its_values_once_the_hook_starts(
    cri_channel, launcher: ProxyLauncher, pod_log_dir
) -> None:
    await launcher.start()  # no hook registered: the pod is made as kubelet asked
    async with launcher.channel() as channel, pod(channel, cri_channel, pod_log_dir, BE, spec(main=batch("500", "128Mi"))) as p:
        _, pid = await start_container(channel, p, "main")
        assert container_values(pid) != BE_VALUES and pod_values(p.cgroup) != BE_VALUES
        async with batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms",
                                      runtime_endpoint=str(launcher.socket)) as hook:
            await written(hook, p, pid)
            pod_name = f"{p.config.metadata.namespace}/{p.config.metadata.name}"
            learned = await hook.logged(lambda line: line.get("msg") == LEARNED and line.get("pod") == pod_name)
            assert (learned["uid"], learned["pod_sandbox_id"], learned["containers"]) == (p.config.metadata.uid, p.id, 1)
            # (Saved off the event loop, in the state files' thread: it may land after the lines above.)
            saved = launcher.dir / "batch-state" / f"{p.config.metadata.uid}.json"
            await until_on_disk(saved.parent, saved.is_file, f"{saved} saved", timeout=20.0)


async def test_a_be_pod_made_while_the_hook_was_down_under_ignore(cri_channel, launcher: ProxyLauncher, pod_log_dir) -> None:
    running, _ = await launcher.start()
    # Registered under Ignore, nobody serving: the hook is down, the proxy goes on without it.
    write_hook_config(launcher.hook_dir, "batchresource", launcher.dir / "batchresource.sock", BatchResourceHook.HOOKS,
                      "Ignore", "5s", remove_with_server=False)
    await registered(running, 1)
    async with launcher.channel() as channel, pod(channel, cri_channel, pod_log_dir, BE, spec(main=batch("500", "128Mi"))) as p:
        _, pid = await start_container(channel, p, "main")
        assert container_values(pid) != BE_VALUES
        async with batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms",
                                      runtime_endpoint=str(launcher.socket)) as hook:
            await written(hook, p, pid)
            pod_name = f"{p.config.metadata.namespace}/{p.config.metadata.name}"
            await hook.logged(lambda line: line.get("msg") == LEARNED and line.get("pod") == pod_name)


async def test_a_container_made_while_the_hook_was_down_in_a_pod_it_knew(cri_channel, launcher: ProxyLauncher, pod_log_dir) -> None:
    """main made through the hook, then the hook down (Ignore): side made as
    kubelet asked. The restarted hook finds side by the listing and writes its
    values once; main, set by the hook, is left as it is."""
    running, _ = await launcher.start()
    two = spec(main=batch("500", "128Mi"), side=batch("250", "64Mi"))
    async with launcher.channel() as channel, pod(channel, cri_channel, pod_log_dir, BE, two) as p:
        async with batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms",
                                      runtime_endpoint=str(launcher.socket)):
            await registered(running, 1)
            _, main_pid = await start_container(channel, p, "main")
            assert container_values(main_pid) == BE_VALUES  # through the hook
        write_hook_config(launcher.hook_dir, "batchresource", launcher.dir / "batchresource.sock", BatchResourceHook.HOOKS,
                          "Ignore", "5s", remove_with_server=False)
        await registered(running, 1)
        side_id, side_pid = await start_container(channel, p, "side")
        side_values = (256, 25000, 64 * MIB)
        assert container_values(side_pid) != side_values  # kubelet's: the hook was down
        async with batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms",
                                      runtime_endpoint=str(launcher.socket)) as hook:
            pod_name = f"{p.config.metadata.namespace}/{p.config.metadata.name}"
            told = await hook.logged(lambda line: line.get("msg") == UNTOLD and line.get("pod") == pod_name, timeout=20.0)
            assert (told["container"], told["container_id"]) == ("side", side_id)
            assert container_values(side_pid) == side_values and container_values(main_pid) == BE_VALUES
        # (The list is saved at the end of a pass, or at the hook's stop: read once it stopped.)
        saved = json.loads((launcher.dir / "batch-state" / f"{p.config.metadata.uid}.json").read_text())
        assert sorted(saved["containers"]) == [["main", 0], ["side", 0]]
