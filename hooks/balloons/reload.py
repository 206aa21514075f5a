"""The balloons hook's config, reloaded when its file changes (``hook run --config``)."""

from __future__ import annotations

import logging
from pathlib import Path

import watchfiles

from . import restoring
from .config import ConfigError, load_config_file
from .pool import PoolError
from .sync import RuntimeSync

log = logging.getLogger("hooks.balloons")


class ConfigReload(RuntimeSync):
    """The file watch and the reload of :class:`hooks.balloons.server.BalloonsHook`
    (its ``__init__`` sets the state they share: :class:`RuntimeSync`)."""

    async def _watch_config(self, path: Path) -> None:
        # The directory, not the file: editors and ConfigMaps replace files by rename.
        last = path.read_bytes() if path.exists() else b""  # noqa: ASYNC240 - a small config file, read once at start
        async for _ in watchfiles.awatch(path.parent, debounce=200, step=50):
            try:
                current = path.read_bytes()  # noqa: ASYNC240 - the same small file, on a change the watcher saw
            except OSError:
                continue
            if current != last:
                last = current
                await self.reload(path)

    async def reload(self, path: Path) -> bool:
        """Take a changed config; a broken one is logged and the last good one stays."""
        try:
            config = load_config_file(path)
            async with self._lock:
                # On the machine as it is now: a config that did not fit it after hotplug may now.
                state = restoring.replan(self._state, config, self._topology)
                endpoint_was, self._state = self._state.config.runtime_endpoint, state
                self._topology_problem = None
                # Saved in the new stateDir, if any, from the start-up rebuild
                # on (a retry, if the last write failed); a restart reads the one it started with.
                self._save(retry=True)
                if config.runtime_endpoint != endpoint_was:
                    self._retargets += 1
                    log.info("moving containers through %s from now on (runtimeEndpoint changed)",
                             config.runtime_endpoint, extra={"runtime_endpoint": config.runtime_endpoint})
                    await self._runtime.retarget(config.runtime_endpoint)
        except (ConfigError, PoolError) as exc:
            log.error("config reload failed, keeping the last good config: %s", exc, extra={"config": str(path)})
            return False
        for warning in config.warnings:
            log.warning("config: %s", warning)
        log.info("config reloaded from %s", path, extra={"config": str(path)})
        self._moves_due.set()
        return True
