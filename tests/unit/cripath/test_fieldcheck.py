"""How refused fields are named: once per kind, a bounded number of kinds."""

from __future__ import annotations

from runtimeproxy.cripath.fieldcheck import summarize


def test_summarize_keeps_the_first_path_of_each_kind_in_order() -> None:
    paths = ["config.mounts[0].x", "annotations['a'].y", "config.mounts[3].x", "#999", "annotations['b'].y"]
    assert summarize(paths) == ["config.mounts[0].x (+1 like it)", "annotations['a'].y (+1 like it)", "#999"]


def test_summarize_bounds_the_number_of_kinds() -> None:
    paths = [f"f{i}" for i in range(13)]
    assert summarize(paths, kinds=10) == [*paths[:10], "and 3 more kinds"]
    assert summarize([]) == []
