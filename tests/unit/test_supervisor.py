"""The owner of the background tasks: restarts, failure, drain, stop order."""

from __future__ import annotations

import asyncio

import pytest

from runtimeproxy.supervisor import Restart, Supervisor, TaskFailed

QUICK = Restart(first_delay=0.001, max_delay=0.004, attempts=3)


async def test_a_service_that_dies_is_restarted() -> None:
    tasks = Supervisor()
    runs: list[int] = []
    serving = asyncio.Event()

    async def flaky() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError("boom")
        serving.set()
        await asyncio.Event().wait()

    tasks.keep_running("svc", flaky, QUICK)
    await asyncio.wait_for(serving.wait(), 5)
    assert len(runs) == 3 and not tasks.failed.is_set()
    await tasks.close()
    assert tasks.running("svc") == []


async def test_a_service_that_keeps_dying_fails_the_supervisor() -> None:
    tasks = Supervisor()
    runs: list[int] = []

    async def broken() -> None:
        runs.append(1)
        raise RuntimeError("boom")

    tasks.keep_running("svc", broken, QUICK)
    await asyncio.wait_for(tasks.failed.wait(), 5)
    assert len(runs) == QUICK.attempts + 1
    assert isinstance(tasks.error, TaskFailed) and "svc" in str(tasks.error)


async def test_a_service_restarted_without_a_limit_never_fails_the_supervisor() -> None:
    """``attempts=None`` (the image backend's watch): restarted for as long
    as it dies. Before: the count was always bounded."""
    tasks = Supervisor()
    runs: list[int] = []
    enough = asyncio.Event()

    async def broken() -> None:
        runs.append(1)
        if len(runs) == 20:
            enough.set()
        raise RuntimeError("boom")

    tasks.keep_running("svc", broken, Restart(first_delay=0.001, max_delay=0.002, attempts=None))
    await asyncio.wait_for(enough.wait(), 5)
    assert not tasks.failed.is_set() and tasks.running("svc") != []
    await tasks.close()


@pytest.mark.parametrize("failures", [1030, 10_000, 10**9])
def test_the_backoff_of_a_service_restarted_forever_stays_at_its_cap(failures: int) -> None:
    """Before: ``first_delay * 2 ** (failures - 1)`` raised OverflowError
    from failure ~1030 on, which killed the restarting task."""
    forever = Restart(0.1, 30.0, None)
    assert forever.delay(failures) == 30.0
    assert [forever.delay(n) for n in (1, 2, 3)] == [0.1, 0.2, 0.4]


class _BrokenRestart(Restart):
    def delay(self, failures: int) -> float:
        raise OverflowError("int too large to convert to float")


async def test_a_service_whose_restarting_fails_is_logged_and_fails_the_supervisor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: the task that restarts the service died with the error and
    was dropped unlooked at: nothing logged it, nothing ran the service."""
    tasks = Supervisor()

    async def broken() -> None:
        raise RuntimeError("boom")

    tasks.keep_running("svc", broken, _BrokenRestart(attempts=None))
    await asyncio.wait_for(tasks.failed.wait(), 5)
    assert isinstance(tasks.error, TaskFailed) and "OverflowError" in str(tasks.error)
    [told] = [r for r in caplog.records if r.getMessage() == "background task's restarts failed; nothing restarts it"]
    assert told.task == "svc" and told.exc_info is not None  # type: ignore[attr-defined]
    assert tasks.running("svc") == []


async def test_a_service_that_returns_is_restarted_too() -> None:
    tasks = Supervisor()
    runs: list[int] = []

    async def returns() -> None:
        runs.append(1)

    tasks.keep_running("svc", returns, QUICK)
    await asyncio.wait_for(tasks.failed.wait(), 5)
    assert len(runs) == QUICK.attempts + 1


async def test_a_long_healthy_run_starts_the_count_afresh() -> None:
    tasks = Supervisor()
    runs: list[int] = []
    done = asyncio.Event()

    async def dies_after_a_while() -> None:
        runs.append(1)
        if len(runs) == 10:
            done.set()
            await asyncio.Event().wait()
        raise RuntimeError("boom")

    # healthy_after=0: every run counts as healthy, so no run is ever the last straw
    tasks.keep_running("svc", dies_after_a_while, Restart(first_delay=0.001, attempts=1, healthy_after=0))
    await asyncio.wait_for(done.wait(), 5)
    assert not tasks.failed.is_set()
    await tasks.close()


async def test_one_shot_failures_are_logged_and_critical_ones_fail(caplog: pytest.LogCaptureFixture) -> None:
    tasks = Supervisor()

    async def boom() -> None:
        raise RuntimeError("boom")

    await asyncio.wait([tasks.spawn("rebuild", boom(), fields={"key": "k1"})])
    assert not tasks.failed.is_set()
    record = next(r for r in caplog.records if r.getMessage() == "background task failed")
    assert record.task == "rebuild" and record.key == "k1"  # type: ignore[attr-defined]
    await asyncio.wait([tasks.spawn("health", boom(), critical=True)])
    assert tasks.failed.is_set() and "health" in str(tasks.error)


async def test_drain_waits_for_drained_tasks_and_those_they_start() -> None:
    tasks = Supervisor()
    finished: list[str] = []
    release = asyncio.Event()

    async def post_hook() -> None:
        await release.wait()
        finished.append("post")

    async def finish_call() -> None:
        await asyncio.sleep(0)
        tasks.spawn("post-hook", post_hook(), drain=True)
        finished.append("finish")

    tasks.spawn("finish", finish_call(), drain=True)
    other = tasks.spawn("rebuild", asyncio.Event().wait())
    draining = asyncio.ensure_future(tasks.drain())
    await asyncio.sleep(0.01)
    assert not draining.done()
    release.set()
    await asyncio.wait_for(draining, 5)
    assert finished == ["finish", "post"]
    assert not other.done()  # not drained: stopped
    await tasks.close()
    assert other.cancelled()


async def test_stop_goes_name_by_name() -> None:
    tasks = Supervisor()
    order: list[str] = []

    async def until_cancelled(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            order.append(name)
            await asyncio.sleep(0)  # a slow clean-up: the next name must wait for it

    for name in ("b", "a", "c"):
        tasks.spawn(name, until_cancelled(name))
    await asyncio.sleep(0)
    await tasks.stop(["a", "b", "c"])
    assert order == ["a", "b", "c"]


@pytest.mark.parametrize("how", ["stop", "close"])
@pytest.mark.parametrize("where", ["running", "backing off"])
async def test_an_orderly_stop_leaves_the_supervisor_clean(how: str, where: str) -> None:
    """A service cancelled by the supervisor's own stop, in its run or in its
    backoff, is no failure: shutdown must not exit non-zero for it. Guards
    existing behaviour (a failure counted for a cancel passed every test)."""
    tasks = Supervisor()
    there = asyncio.Event()

    async def service() -> None:
        if where == "running":
            there.set()
            await asyncio.Event().wait()
        there.set()
        raise RuntimeError("boom")  # then sleeps a long backoff

    tasks.keep_running("svc", service, Restart(first_delay=60, max_delay=60, attempts=None))
    await asyncio.wait_for(there.wait(), 5)
    await asyncio.sleep(0)  # into run()'s wait, or past the raise into the backoff's sleep
    await (tasks.stop(["svc"]) if how == "stop" else tasks.close())
    assert tasks.running("svc") == []
    assert not tasks.failed.is_set() and tasks.error is None


async def test_a_cancel_raised_out_of_run_is_a_death_restarted(caplog: pytest.LogCaptureFixture) -> None:
    """``run()`` raising CancelledError while nobody cancelled the service
    (a grpc.aio call on a channel closed under it): restarted like any death
    (before: re-raised, the service ended as cancelled, silently, for good)."""
    tasks = Supervisor()
    runs: list[int] = []
    again = asyncio.Event()

    async def service() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise asyncio.CancelledError()
        again.set()
        await asyncio.Event().wait()

    tasks.keep_running("svc", service, QUICK)
    await asyncio.wait_for(again.wait(), 5)
    assert len(runs) == 2 and not tasks.failed.is_set()
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == ["background task died"]
    await tasks.close()


async def test_a_failed_restarter_says_so_in_one_critical_line(caplog: pytest.LogCaptureFixture) -> None:
    """Before: two critical lines, the second saying the service "keeps failing" after 1 failure."""
    tasks = Supervisor()

    async def broken() -> None:
        raise RuntimeError("boom")

    tasks.keep_running("svc", broken, _BrokenRestart(attempts=None))
    await asyncio.wait_for(tasks.failed.wait(), 5)
    assert [r.getMessage() for r in caplog.records if r.levelname == "CRITICAL"] == [
        "background task's restarts failed; nothing restarts it"
    ]
