"""Issue 82.2: docs/ARCHITECTURE.md's "Where to add" is proven by doing it. Each test adds
one thing (an engine, a metric, a task, a connection with a field of its own) to a copy of
the package, writing only through `_Copy.edit`/`_Copy.new`, which record the files
touched; a fresh interpreter on the copy then uses the addition as a user would. The docs'
"Touches N files: ..." for that kind must name exactly the files the addition touched: the
counts come from doing it, not from a number written here."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "src" / "gpufleet"


class _Copy:
    """The package (and README.md) copied to a folder; every write recorded by its path as
    the docs name it (`cli/tasks.py`, `README.md`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        shutil.copytree(PACKAGE, root / "src" / "gpufleet",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        shutil.copy(REPO / "README.md", root / "README.md")
        self.touched: set[str] = set()

    def _path(self, name: str) -> Path:
        return self.root / name if name == "README.md" else self.root / "src" / "gpufleet" / name

    def edit(self, name: str, anchor: str, text: str, after: bool = True) -> None:
        """Insert `text` after (or before) the one place `anchor` is found."""
        path = self._path(name)
        body = path.read_text()
        assert body.count(anchor) == 1, (name, anchor)
        new = anchor + text if after else text + anchor
        path.write_text(body.replace(anchor, new))
        self.touched.add(name)

    def new(self, name: str, text: str) -> None:
        path = self._path(name)
        assert not path.exists(), name
        path.write_text(text)
        self.touched.add(name)

    def run(self, script: str) -> str:
        """`script` in a fresh interpreter that imports gpufleet from the copy."""
        env = {**os.environ, "PYTHONPATH": str(self.root / "src")}
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script)], cwd=self.root, env=env,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout


def _stated(kind: str, **names: str) -> tuple[int, set[str]]:
    """The docs' "Touches N files: `a`, `b`" for `kind`, with `<name>`-style parts filled."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    section = text[text.index("## Where to add") :]
    bullet = section[section.index(f"- **{kind}**") :]
    bullet = bullet[: bullet.index("\n- **", 3)]
    found = re.search(r"Touches (\d+) files?: (.*?)(?:\(|$)", " ".join(bullet.split()))
    assert found, f"{kind}: no 'Touches N files' line"
    files = set()
    for name in re.findall(r"`([^`]+)`", found.group(2)):
        for part, value in names.items():
            name = name.replace(f"<{part}>", value)
        files.add(name)
    return int(found.group(1)), files


def _holds(kind: str, copy: _Copy, **names: str) -> None:
    count, files = _stated(kind, **names)
    assert files == copy.touched, (kind, sorted(files), sorted(copy.touched))
    assert count == len(copy.touched), (kind, count, sorted(copy.touched))


@pytest.fixture
def copy(tmp_path):
    return _Copy(tmp_path / "tree")


def test_an_engine_is_one_line_in_the_registry(copy, tmp_path):
    copy.edit("control/server/engines.py", '        Engine("custom",',
              '        Engine("trial", "openai", command=("trial-server", "--port", "{port}"),\n'
              "               needs_gpu=False),\n", after=False)  # fmt: skip
    out = copy.run(f"""
        from gpufleet.control.bench.run import engine_backend
        from gpufleet.control.inventory.model import Host
        from gpufleet.control.server import engines
        from gpufleet.control.server.profiles import Profile, build_specs, load_profile
        assert engines.__file__.startswith({str(copy.root)!r})
        open("trial.yaml", "w").write("engine: trial\\nmodel_path: {tmp_path}\\n")
        profile = load_profile("trial.yaml")
        [(_, spec)] = build_specs(profile, [Host(name="h", connection="local", gpus={{"count": 0}})])
        print(spec.argv[0], spec.port in [int(a) for a in spec.argv if a.isdigit()])
        print(engine_backend("trial.yaml"))
        print("trial" in engines.NAMES)
    """)  # fmt: skip
    lines = out.splitlines()
    assert lines == ["trial-server True", "openai", "True"], out
    _holds("an engine", copy)


def test_a_metric_is_its_figure_its_row_field_and_its_catalogue_line(copy):
    """Three files: the figure (host/bench/metrics.py), the row's declared field
    (records.py ResultRow) and the catalogue line. Without the row's field the figure
    would land in the row's `extra`, undeclared, and the catalogue's check that every
    metric is a declared field fails (shown here before the field is added)."""
    copy.edit("host/bench/metrics.py", '        "p10_per_request_output_tps": percentile(speeds, 10),\n',
              '        "p90_per_request_output_tps": percentile(speeds, 90),\n')  # fmt: skip
    copy.edit("report/catalogue.py",
              '"per-request tok/s (p10)", "tok/s", True, "{:.1f}", R),\n',
              '    _m("p90_per_request_output_tps", "per-request tok/s (p90)", "tok/s", True,\n'
              '       "{:.1f}", R),\n')  # fmt: skip
    check = """
        import dataclasses
        from gpufleet.host.bench.level import LevelRun, RequestRecord
        from gpufleet.host.bench.metrics import summarize
        from gpufleet.records import ResultRow
        from gpufleet.report import catalogue
        records = [RequestRecord(0, ok=True, ttft=0.2, e2e=1.0, completion_tokens=5),
                   RequestRecord(1, ok=True, ttft=0.2, e2e=0.5, completion_tokens=5)]
        figures = summarize(LevelRun(2, float("inf"), 1.0, records, 0.0), "openai")
        row = ResultRow.from_wire({**figures, "max_concurrency": 2})
        declared = {f.name for f in dataclasses.fields(ResultRow)} - {"extra"}
        key = "p90_per_request_output_tps"
        print(key in {m.key for m in catalogue.CATALOGUE}, row.get(key), key in declared)
    """
    assert copy.run(check).split() == ["True", "9.5", "False"]  # in `extra`: undeclared
    copy.edit("records.py", "    p10_per_request_output_tps: F = None\n",
              "    p90_per_request_output_tps: F = None\n")  # fmt: skip
    assert copy.run(check).split() == ["True", "9.5", "True"]
    _holds("a metric", copy)


def test_a_task_is_its_function_its_collection_line_and_its_readme_row(copy):
    copy.edit("cli/fleet_tasks.py", "from gpufleet.report import catalogue\n", '''
GREET = OptionSet(who=Option("whom to greet", default="world"))


@GREET.task()
def greet(c, **given):
    """Say hello (added at run time by tests/test_where_to_add.py)."""
    from gpufleet.cli.output import line

    line(f"hello {GREET.parse(given).who}")
''')  # fmt: skip
    copy.edit("cli/tasks.py", "from gpufleet.cli.fleet_tasks import fleet, history, metrics\n",
              "from gpufleet.cli.fleet_tasks import greet\n")  # fmt: skip
    copy.edit("cli/tasks.py", "    metrics,\n)", "\n    greet,", after=False)
    copy.edit("README.md", "| `hosts` |", "| `greet` | says hello | `inv greet --who ops` |\n",
              after=False)  # fmt: skip
    out = copy.run("""
        import re
        from invoke import Context
        from gpufleet.cli.tasks import ns, option_sets
        table = set(re.findall(r"^\\| `([a-z-]+)` \\|", open("README.md").read(), re.M))
        print(table == set(ns.task_names), "GREET" in option_sets())
        ns["greet"](Context(), who="ops")
    """)  # fmt: skip
    assert out.splitlines() == ["True True", "hello ops"], out
    _holds("a task", copy, theme="fleet")


def test_a_connection_with_a_field_is_its_module_and_its_registry(copy):
    """The connection of tests/test_connection_registry.py (a `container:` field no other
    connection has), added for real: its Session in a module of its own, its settings and
    registry line in control/inventory/connections.py (where the built-in connections'
    settings are: the inventory, below control/connect/, validates with them)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "connection_trial", REPO / "tests" / "test_connection_registry.py"
    )
    trial = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = trial  # inspect reads a class's source through its module
    spec.loader.exec_module(trial)

    settings = inspect.getsource(trial.ContainerSettings).replace("connections.Settings",
                                                                  "Settings")  # fmt: skip
    copy.edit("control/inventory/connections.py", "@dataclass(frozen=True)\nclass Connection:",
              settings + "\n\n", after=False)  # fmt: skip
    copy.edit(
        "control/inventory/connections.py",
        '"gpufleet.control.connect.srun", "SrunSession"),\n',
        '        Connection("container", ContainerSettings,\n'
        '                   "gpufleet.control.connect.container", "ContainerSession"),\n',
    )
    copy.new("control/connect/container.py",
             '"""A container on this machine (tests/test_where_to_add.py)."""\n\n'
             "from gpufleet.control.connect.local import LocalSession\n\n\n"
             + inspect.getsource(trial.ContainerSession))  # fmt: skip
    out = copy.run("""
        from gpufleet.control.connect.pool import open_session
        from gpufleet.control.inventory.model import load_inventory
        from gpufleet.host.agent.protocol import StatusArgs
        open("inv.yaml", "w").write("hosts:\\n  a:\\n    connection: container\\n"
                                    "    container: web1\\n")
        host = load_inventory("./inv.yaml").hosts["a"]
        session = open_session(host)
        try:
            print(type(session).__name__, host.settings.describe(),
                  session.with_host(StatusArgs()).slurm_node, sep="|")
        finally:
            session.close()
    """)
    assert out.strip() == "ContainerSession|container web1 on a|web1", out
    _holds("a connection", copy, name="container")


def test_a_bench_client_is_its_module_and_its_registry_line(copy, sim_server):
    """A bench client (`--engine`) added for real: its level function in a module of its
    own and its line in host/bench/clients.py. The runner calls the function the entry
    names, so nothing else changes: the task takes `--engine trial`, refuses what the entry
    says the client cannot do, and a run through it measures a level against a real
    (rehearsal) server. Before: the runner chose the level by the entry's `external` flag,
    so a third client was a branch in host/bench/runner.py too."""
    server = sim_server()
    copy.new("host/bench/trial.py", textwrap.dedent('''
        """gpufleet's generator held to one process (tests/test_where_to_add.py)."""

        import dataclasses

        from gpufleet.host.bench import ownclient
        from gpufleet.host.bench.clientapi import BenchRun, LevelOutcome
        from gpufleet.records import Level


        def bench_level(run: BenchRun, level: Level) -> LevelOutcome:
            one = dataclasses.replace(run.plan, client_procs=1)
            outcome = ownclient.bench_level(dataclasses.replace(run, plan=one), level)
            run.writer.event({"level": level.concurrency, "phase": "trial"})
            return outcome
    ''').lstrip())  # fmt: skip
    copy.edit("host/bench/clients.py", "            request_limit_s=20 * 3600.0,\n        ),\n",
              '        BenchClient("trial", "one process", "gpufleet.host.bench.trial:bench_level",\n'
              "                    processes=False),\n")  # fmt: skip
    out = copy.run(f"""
        import json, pathlib
        from gpufleet.cli.bench_tasks import BENCH
        from gpufleet.control.bench.request import check_combination
        from gpufleet.host.bench.runner import run_plan
        from gpufleet.records import BenchPlan, Level, PromptRow
        print(BENCH.parse({{"engine": "trial", "concurrency": ["2"]}}).engine)
        request = BENCH.parse({{"engine": "trial", "concurrency": ["2"], "client_procs": "2"}})
        try:
            check_combination(request, [PromptRow(prompt="hi")], "p")
        except Exception as exc:
            print(exc)
        run = pathlib.Path("run")
        run.mkdir()
        plan = BenchPlan(run_id="r1", engine="trial", levels=[Level(concurrency=2, num_prompts=4)],
                         base_url={server.url!r}, output_len=4, client_procs="2")
        (run / "plan.json").write_text(plan.to_json())
        (run / "prompts.jsonl").write_text((json.dumps({{"prompt": "hi"}}) + "\\n") * 4)
        print(run_plan(run)["status"])
        [row] = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
        events = [json.loads(line) for line in (run / "progress.jsonl").read_text().splitlines()]
        print(row["max_concurrency"], row["completed"], row["client_procs"],
              [e["phase"] for e in events if "phase" in e])
    """)  # fmt: skip
    assert out.splitlines() == [
        "trial",
        "--engine trial: it is one process; --client-procs needs --engine gpufleet",
        "done",
        "2 4 1 ['start', 'end', 'trial']",
    ], out
    _holds("a bench client", copy, name="trial")
