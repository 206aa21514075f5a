"""The operator documentation (README.md and docs/) against the code: a flag,
setting, hook-file key or metric added or changed on one side only fails here."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import pytest
import yaml

from runtimeproxy import cli
from runtimeproxy.config import ProxyConfig, choices
from runtimeproxy.hookpath import hookfile
from runtimeproxy.hookpath.chaincpuset import noted
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType
from runtimeproxy.koordflags import KOORD_FLAGS
from runtimeproxy.hookpath.validate import OutsideParent
from runtimeproxy.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
CODE = re.compile(r"`([^`]+)`")


def table(path: Path, first_header: str) -> list[dict[str, str]]:
    """The rows of the markdown table whose first column is ``first_header``."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == len(header), f"{path.name}: row with {len(cells)} cells: {line}"
        rows.append(dict(zip(header, cells, strict=True)))
    assert rows, f"{path.name}: the {first_header} table is empty"
    return rows


def code(cell: str) -> list[str]:
    return CODE.findall(cell)


def literal(cell: str) -> object:
    """A default cell's value: its first `code` span read as YAML; None when it
    has none (a default described in words: none, off, the backend...)."""
    spans = code(cell)
    return yaml.safe_load(spans[0]) if spans else None


def plain(value: object) -> object:
    return str(value) if isinstance(value, Path) else value


# --------------------------------------------------------------------------- configuration

CONFIG_DOC = DOCS / "configuration.md"


def config_rows() -> list[dict[str, str]]:
    return table(CONFIG_DOC, "flag")


def serve_options() -> dict[str, click.Option]:
    return {
        param.opts[0]: param
        for param in cli.serve.params
        if isinstance(param, click.Option) and param.opts[0].startswith("--") and param.name != "help"
        and not param.hidden  # koord-runtime-proxy's, aliases or refused (koordflags)
    }


def test_every_serve_flag_has_a_row_and_no_row_names_another() -> None:
    documented = [code(row["flag"])[0].split()[0] for row in config_rows() if row["flag"]]
    assert len(documented) == len(set(documented)), "a flag has two rows"
    assert set(documented) == set(serve_options())


def test_documented_flag_defaults_are_the_flags_defaults() -> None:
    options = serve_options()
    ctx = click.Context(cli.serve)
    for row in config_rows():
        if row["flag"]:
            option = options[code(row["flag"])[0].split()[0]]
            default = option.get_default(ctx)
            if not isinstance(default, (str, int, float, Path)):
                default = None  # no default (click 8.3 says so with a sentinel of its own)
            assert literal(row["default"]) == plain(default), row


def test_every_setting_has_a_row_with_its_default() -> None:
    defaults = ProxyConfig()
    settings = {f.name for f in dataclasses.fields(ProxyConfig)} - {"extra"}
    documented: dict[str, dict[str, str]] = {}
    for row in config_rows():
        for key in code(row["YAML key"]):
            assert key.replace("-", "_") not in documented, f"{key} has two rows"
            documented[key.replace("-", "_")] = row
    assert set(documented) == settings
    for setting, row in documented.items():
        assert literal(row["default"]) == plain(getattr(defaults, setting)), (setting, row)
        # every value a choice setting accepts is named in its row
        offered = set(code(row["default"]) + code(row["what"]))
        assert set(choices(setting)) <= offered, (setting, row)


def test_parser_reads_a_default_in_words_as_none() -> None:
    # The comparison above must not pass by reading every cell as None.
    assert literal("`16777216` (16 MiB)") == 16777216
    assert literal("the backend") is None
    rows = {row["flag"]: row for row in config_rows()}
    assert literal(rows["`--listen PATH`"]["default"]) == "/var/run/runtime-proxy/runtime-proxy.sock"


# --------------------------------------------------------------------------- hook files

HOOK_DOC = DOCS / "hook-files.md"


def test_hook_file_keys_and_defaults() -> None:
    rows = {code(row["key"])[0]: row for row in table(HOOK_DOC, "key")}
    assert set(rows) == set(hookfile.KNOWN_KEYS)
    assert rows[hookfile.KEY_ENDPOINT]["default"] == "required"
    assert code(rows[hookfile.KEY_TIMEOUT]["default"]) == [hookfile.format_duration(hookfile.DEFAULT_TIMEOUT)]
    assert literal(rows[hookfile.KEY_PRIORITY]["default"]) == hookfile.DEFAULT_PRIORITY
    assert code(rows[hookfile.KEY_FAILURE_POLICY]["default"]) == [hookfile.FailurePolicy.IGNORE.value]
    # The default, then the files whose server answers whole by default.
    assert code(rows[hookfile.KEY_ANSWERS]["default"]) == [
        hookfile.Answers.CHANGES.value, hookfile.Answers.WHOLE.value, *sorted(hookfile.WHOLE_BY_DEFAULT)
    ]
    assert f"`{hookfile.format_duration(hookfile.MAX_TIMEOUT)}`" in rows[hookfile.KEY_TIMEOUT]["what"]


def test_hook_points_and_their_cri_calls() -> None:
    rows = {code(row["hook point"])[0]: row for row in table(HOOK_DOC, "hook point")}
    assert set(rows) == {hook.value for hook in HookType}
    for hook, point in HOOK_POINTS.items():
        assert rows[hook.value]["CRI call"] == point.cri_method


# --------------------------------------------------------------------------- metrics

METRICS_DOC = DOCS / "metrics.md"


def exposed_metrics() -> dict[str, str]:
    """Every metric family of the proxy's registry, by the name Prometheus
    scrapes (those registered only with some settings included)."""
    metrics = Metrics()
    metrics.image_backend()  # with --image-backend only
    families = metrics.registry.collect()
    return {f"{f.name}_total" if f.type == "counter" else f.name: f.type for f in families}


def test_every_metric_has_a_row_and_every_row_a_metric() -> None:
    rows = {code(row["metric"])[0]: row for row in table(METRICS_DOC, "metric")}
    exposed = exposed_metrics()
    assert set(rows) == set(exposed)
    for name, kind in exposed.items():
        assert rows[name]["type"] == kind, name


def test_metrics_are_named_as_prometheus_wants() -> None:
    for name, kind in exposed_metrics().items():
        assert re.fullmatch(r"runtime_proxy_[a-z_]+", name), name
        assert name.endswith("_total") == (kind == "counter"), name
        if kind == "histogram":
            assert name.endswith("_seconds"), name


# --------------------------------------------------------------------------- migration

MIGRATION_DOC = DOCS / "migrating-from-koord-runtime-proxy.md"


def test_migration_covers_every_koordinator_flag_and_names_real_flags() -> None:
    rows = table(MIGRATION_DOC, "koord-runtime-proxy")
    theirs = {span for row in rows for span in code(row["koord-runtime-proxy"]) if span.startswith("--")}
    assert theirs == set(KOORD_FLAGS)  # each also known to serve (koordflags)
    ours = {span for row in rows for span in code(row["runtime-proxy"]) if span.startswith("--")}
    assert ours and ours <= set(serve_options())
    named = {koord.ours for koord in KOORD_FLAGS.values() if koord.ours}
    assert named <= ours
    for row in rows:
        flags = [span for span in code(row["koord-runtime-proxy"]) if span.startswith("--")]
        for flag in flags:
            replacement = KOORD_FLAGS[flag].ours
            if replacement:  # an alias: the row says so and names it
                assert code(row["runtime-proxy"]) == [replacement] and "deprecated alias" in row["notes"], flag
            else:  # accepted only for what the proxy does: the row's default
                assert KOORD_FLAGS[flag].what_we_do in code(row["its default"])[0].split(", ") + code(row["its default"]), flag


def test_migration_names_the_skip_label_the_proxy_uses() -> None:
    from runtimeproxy.hookpath.executorbase import SKIP_LABEL

    assert f"`{SKIP_LABEL}=true`" in MIGRATION_DOC.read_text()


# --------------------------------------------------------------------------- cgroup v1 cpusets

CPUSETS_HEADING = "cgroup v1: cpusets and the pod's parent"


def test_the_chain_cpuset_rules_are_told_once_and_linked_to() -> None:
    """One full account, in hook-files.md; README, troubleshooting and metrics link to it."""
    page = (DOCS / "hook-files.md").read_text()
    assert f"\n## {CPUSETS_HEADING}\n" in page
    anchor = re.sub(r"[^a-z0-9 -]", "", CPUSETS_HEADING.lower()).replace(" ", "-")  # as GitHub makes it
    for doc in (README, DOCS / "troubleshooting.md", DOCS / "metrics.md"):
        assert f"hook-files.md#{anchor})" in doc.read_text(), doc.name
    # The note a move's refusal carries, as the code words it.
    note = noted([OutsideParent("cpuset_cpus", "'1' names CPUs")], {"cpuset_cpus": "NAME.json"})[0].split(", ", 1)[1]
    assert f"`{note}`" in " ".join(page.split())


# --------------------------------------------------------------------------- README


@pytest.mark.parametrize("doc", sorted(p.name for p in DOCS.glob("*.md")))
def test_every_doc_is_linked_from_readme(doc: str) -> None:
    assert f"(docs/{doc}" in README.read_text()


def test_relative_links_resolve() -> None:
    for page in [README, *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_run_and_test_come_first() -> None:
    # .ci/run runs README's test command: it stays at the top, as written.
    sections = re.findall(r"^## (.+)$", README.read_text(), re.MULTILINE)
    assert sections[:2] == ["Run it", "Test it"]
    assert "scripts/setup.sh && .venv/bin/python -m pytest -ra" in (REPO / ".ci" / "run").read_text()
    assert "\nscripts/setup.sh && .venv/bin/python -m pytest -ra\n" in README.read_text()


def test_the_stop_time_past_the_grace_period_is_the_one_the_docs_give() -> None:
    from runtimeproxy.cripath.server import DRAIN_FLOOR_S, STOP_PAST_GRACE_S

    unit = (REPO / "systemd" / "runtime-proxy.service").read_text()
    match = re.search(r"^TimeoutStopSec=(\d+)$", unit, re.MULTILINE)  # plain seconds
    assert match is not None
    past, limit = STOP_PAST_GRACE_S, float(match.group(1)) - STOP_PAST_GRACE_S
    for page in (README, DOCS / "configuration.md", DOCS / "troubleshooting.md"):
        text = " ".join(page.read_text().split())
        for said in (f"plus {past:g} s", f"{limit:g} s", f"drain's floor of {DRAIN_FLOOR_S:g} s"):
            assert said in text, (page.name, said)


def layout_entries() -> dict[str, str]:
    """README's Layout block: each top-level entry (``hooks/``) and its text."""
    text = README.read_text()
    block = text[text.index("## Layout"):]
    block = block[block.index("```") + 3:]
    block = block[:block.index("```")]
    entries: dict[str, str] = {}
    name = ""
    for line in block.splitlines():
        if line and not line[0].isspace():
            name, _, line = line.partition(" ")
            entries[name] = ""
        if name:
            entries[name] += " " + line
    return entries


@pytest.mark.parametrize("package", ["runtimeproxy", "runtimeproxy/cripath", "runtimeproxy/hookpath",
                                     "runtimeproxy/frames", "runtimeproxy/hookclient", "runtimeproxy/host",
                                     "runtimeproxy/nri", "hooks"])
def test_the_layout_names_every_module_of_a_package(package: str) -> None:
    entries = layout_entries()
    text = entries[f"{package}/"]
    modules = [p.stem for p in (REPO / package).glob("*.py") if p.stem not in ("__init__", "__main__")]
    modules += [f"{p.parent.name}/" for p in (REPO / package).glob("*/__init__.py")
                if f"{package}/{p.parent.name}/" not in entries]
    missing = [m for m in modules if not re.search(rf"(?<![\w/]){re.escape(m)}(?![\w])", text)]
    assert not missing, f"README's Layout does not name {package}'s {', '.join(sorted(missing))}"
