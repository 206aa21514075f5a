"""What the registry warns of in a hook file it loads: accepted, but likely
not what its writer meant. Each logged as the file is loaded, or as a
change brings it: not at each rescan, nor again at a change of another."""

from __future__ import annotations

import logging

from .hookfile import HookServerConfig

__all__ = ["warn_if_odd"]

# The registry's logger: an operator finds the directory's whole story in one place.
logger = logging.getLogger(__package__ + ".registry")


def warn_if_odd(config: HookServerConfig, previous: HookServerConfig | None) -> None:
    """Warn of each of ``config``'s oddities that ``previous``, the version
    loaded before, did not have: what changed, once (a key spelt otherwise
    logs its note, not the file's other warnings again)."""
    name = config.name
    if config.uncalled_hooks and (previous is None or previous.uncalled_hooks != config.uncalled_hooks):
        logger.warning(
            "hook config %s lists hook points no runtime proxy calls; they are ignored", name,
            extra={**config.log_fields(), "ignored_hooks": sorted(config.uncalled_hooks)},
        )
    for note in config.key_notes:  # a key in another case, or given twice: read as koord-runtime-proxy reads it
        if previous is not None and note in previous.key_notes:
            continue
        meant = "hook_key_read_as" if note.read else "hook_key_meant"  # a key of ours misspelt: ignored
        logger.warning("hook config %s: %s", name, note, extra={
            **config.log_fields(), "hook_key": note.written, meant: note.key, "warning": str(note)})
    if not config.hooks and (previous is None or previous.hooks):
        logger.warning("hook config %s registers no runtime hooks; it will never be called", name, extra=config.log_fields())
