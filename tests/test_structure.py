"""The code's structure holds what issue 36 declared once (benchmarks/code_structure.py
measures it, ast and grep, nothing run): a new option, archive path or level shape that
goes around the one place fails here."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _measure():
    spec = importlib.util.spec_from_file_location(
        "code_structure", REPO / "benchmarks" / "code_structure.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["code_structure"] = module
    spec.loader.exec_module(module)
    return module


def test_options_are_read_only_from_their_parsed_value():
    assert _measure().option_reads() == 0


def test_every_task_is_declared_by_an_option_set():
    """A task's flags come from one OptionSet, declared in the task's own module: its
    signature, help and short flags; a task with a hand-written signature would declare its
    flags twice."""
    from gpufleet.cli.tasks import ns, option_sets

    sets = list(option_sets().values())
    for name in ns.task_names:
        task = ns[name]
        params = [p for p in inspect.signature(task.body).parameters if p != "c"]
        if not params:  # profiles: no options at all
            continue
        owners = [s for s in sets if list(s.options) == params]
        assert owners, f"inv {name}: its flags are not one OptionSet's ({params})"
        assert getattr(task.body, "__signature__", None) is not None, name  # made by the set


def test_no_long_functions_anywhere():
    """No function over 60 lines in any package (issue 49: the ceilings stopped at cli/ and
    control/, and ten functions over 60 lines lived elsewhere)."""
    assert _measure().long_functions() == []


def test_no_function_takes_more_than_eight_parameters():
    """Issue 66: `run_level` took 16 parameters, `one_request` 11, the sweep's and the
    tune's `run` 10 each. A call that carries more passes a frozen spec dataclass
    (host/bench/loadgen.LevelSpec, control/sweep/sweep_run.SweepSetup, ...)."""
    assert _measure().long_signatures() == []


def test_wide_functions_take_the_rest_by_keyword():
    """Issue 82.8: 36 of the 39 functions with 6 or more parameters took them all
    positionally, so a call read `_verify(profile, tuned, checks, request, resume,
    experiment, outcome, clock)` and a reordered parameter shifted a value silently. Past
    the first 4, a wide function's parameters are keyword-only, with no exception (the
    last six, fetch, random_ids, _argv_for, _spec_for, one_request and run_session, went
    keyword-only with their callers)."""
    assert _measure().positional_tails() == []


def test_no_long_modules_anywhere():
    """No module over 450 lines: a module that grows past it holds two jobs."""
    assert _measure().long_modules() == []


def test_every_public_name_of_control_says_what_it_is_for():
    """A docstring on every public function, class and method of control/: its entry points
    are what the next engineer reads first."""
    assert _measure().undocumented_in_control() == []


def test_only_the_archive_builds_archive_paths():
    assert _measure().archive_path_builders() == []


def test_control_never_calls_up_into_cli():
    assert _measure().control_calls_into_cli() == []


def test_plain_dicts_stay_few():
    """`dict[str, Any]` marks a shape not yet declared, and so do its alias wire.JsonObject
    and `dict[str, object]` (issue 66: 39 fell while `dict[str, object]` rose from 4 to 16),
    `dict[Any, ...]`, `Mapping[str, object]` and a bare `dict` annotation (issue 82.3: the
    census counted `dict[str, ...]` only while the tune's measurement was 20
    `dict[Any, dict[int, Any]]`; widened, it read 57): counted together, under 30. A
    declared record's JSON form is wire.JsonDict. The ceiling only comes down."""
    assert sum(_measure().any_dicts().values()) <= 28  # under 30 (issues 66, 82), down only


def test_the_tunes_measurement_is_one_declared_type():
    """Issue 82.3: what a tune measured (arm -> level -> result rows) is
    control/tune/measurement.Measurement, and its figures levels.Cells; no module of
    control/tune/ passes it as an undeclared mapping."""
    import ast
    import inspect

    from gpufleet.control.tune import fixed, table, ties
    from gpufleet.control.tune.measurement import Measurement

    for function in (table.choose, table.rows_by_depth, fixed.choose_fixed, ties.add_round):
        hints = inspect.get_annotations(function)
        assert "Measurement" in hints.values(), function.__name__
    assert {"add", "arms", "levels", "at", "only", "without", "cells"} <= set(vars(Measurement))
    tune = REPO / "src" / "gpufleet" / "control" / "tune"
    found = []
    for path in sorted(tune.glob("*.py")):
        code = path.read_text()
        found += [f"{path.name}:{n}" for n in _measure().bare_dicts(path)]
        found += [f"{path.name}: {m}" for m in ("dict[Any,", "Mapping[str, object]") if m in code]
        assert ast.parse(code)  # every module parses: the census read it all
    assert found == []


def test_every_undeclared_shape_says_whose_it_is():
    """What remains is shapes owned by someone else (SGLang's /server_info, a YAML file
    before validation, Invoke's keywords): each line says whose, in a comment."""
    import re

    pattern = re.compile(
        r"dict\[str,\s*(?:Any|object)\]|dict\[Any,|Mapping\[str,\s*(?:Any|object)\]"
        r"|\bJsonObject\b"
    )
    silent = []
    for path in sorted((REPO / "src" / "gpufleet").rglob("*.py")):
        lines = path.read_text().splitlines()
        silent += [f"{path.relative_to(REPO)}:{n}" for n in _measure().bare_dicts(path)
                   if "#" not in lines[n - 1]]  # fmt: skip
        for number, line in enumerate(lines, 1):
            code = line.split("#")[0]
            declared = "import" in code or "TypeAlias" in code
            if pattern.search(code) and not declared and "#" not in line:
                silent.append(f"{path.relative_to(REPO)}:{number}")
    assert silent == []


# how a declared distribution is imported, where the names differ
IMPORT_NAMES = {
    "pyyaml": "yaml",
    "nvidia-ml-py": "pynvml",
    "prometheus-client": "prometheus_client",
}


def test_every_declared_dependency_is_imported_under_src():
    """Issue 66: psutil stayed a dependency after the /proc reader replaced it. Every
    distribution pyproject.toml requires at run time is imported somewhere under src/."""
    import re
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    source = "\n".join(p.read_text() for p in (REPO / "src" / "gpufleet").rglob("*.py"))
    unused = []
    for dep in deps:
        name = re.split(r"[<>=;\[ ]", dep, maxsplit=1)[0].strip().lower()
        module = IMPORT_NAMES.get(name, name.replace("-", "_"))
        if not re.search(rf"^\s*(import|from) {re.escape(module)}\b", source, re.M):
            unused.append(name)
    assert unused == []


def test_the_readme_task_table_lists_every_task():
    """Issue 66: the README's table of tasks names exactly the tasks `inv --list` shows."""
    import re

    from gpufleet.cli.tasks import ns

    readme = (REPO / "README.md").read_text()
    table = set(re.findall(r"^\| `([a-z-]+)` \|", readme, re.M))
    assert table == set(ns.task_names), (set(ns.task_names) - table, table - set(ns.task_names))


# where SGLang's speculative algorithm names may be spelled: the facts, and the rehearsal
# engine's argument parser (SGLang's own list of choices, which it mirrors)
ALGORITHM_NAMES = {"EAGLE", "EAGLE3", "STANDALONE"}
ALGORITHMS_ALLOWED = {"engine_facts.py", "sim/serverargs.py"}


def test_engine_facts_are_stated_once():
    """Issue 66, bullet 1: the speculative cap (48) and the algorithms it and adaptive
    speculation apply to were restated in the adapters, the tuner, the report and the
    rehearsal engine. Now only engine_facts.py states them: a string constant naming one of
    the algorithms, or the number 48 in a module that reasons about speculation, anywhere
    else fails here."""
    import ast

    from gpufleet.control.server import engines

    root = REPO / "src" / "gpufleet"
    found = []
    for path in root.rglob("*.py"):
        where = str(path.relative_to(root))
        if where in ALGORITHMS_ALLOWED:
            continue
        text = path.read_text()
        speculative = "specul" in text
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and node.value in ALGORITHM_NAMES:
                found.append(f"{where}:{node.lineno} {node.value!r}")
            if isinstance(node, ast.Constant) and node.value == 48 and speculative:
                found.append(f"{where}:{node.lineno} 48")
    assert found == []
    # the engine names: the adapter registry's, not a Literal beside it
    profiles = (root / "control" / "server" / "profiles.py").read_text()
    assert not any(f'"{name}", "' in profiles for name in engines.NAMES)


def test_the_interruptible_watch_and_the_figure_claims_are_written_once():
    """Issue 66, bullet 6: the loop that calls a long verb in slices and checks the cancel
    token between them was written twice (bench watch, wait-ready), and answer.py built the
    per-request and the total claims with one function's body each. A loop calling a verb
    again lives only in Session.call_in_slices; one function reads a figure's crossing and
    verdicts for every claim."""
    import ast

    root = REPO / "src" / "gpufleet"
    loops = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.While):
                calls = {n.func.attr for n in ast.walk(node)
                         if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}  # fmt: skip
                if "call_resumable" in calls and "check" in calls:
                    loops.append(str(path.relative_to(root)))
    assert loops == ["control/connect/base.py"]
    answer = (root / "report" / "answer.py").read_text()
    assert answer.count("crossover_text(") == 1 and answer.count("verdicts(a, b, levels, ") == 2


def test_request_dialects_live_in_one_registry():
    """Issue 66, bullet 4: the dialects were a tuple in kinds.py, two branches in the
    sender and a map in the bench_serving runner. Now one registry (host/bench/dialects.py)
    names each dialect's route, body, stream reading and bench_serving name; --backend's
    choices and every engine adapter's default are its names; no other module of the load
    generator spells a route."""
    import ast

    from gpufleet.cli.common_options import request_options
    from gpufleet.control.server.engines import ENGINES
    from gpufleet.host.bench.dialects import DIALECTS, NAMES

    assert {e.backend for e in ENGINES.values()} <= set(NAMES)
    assert "expected sglang, openai or openai-chat" in _refusal(request_options(), "backend")
    routes = {d.route for d in DIALECTS.values()}
    spelled = []
    for path in (REPO / "src" / "gpufleet" / "host" / "bench").glob("*.py"):
        if path.name == "dialects.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in routes:
                spelled.append(f"{path.name}:{node.lineno}")
    assert spelled == []


def _refusal(options, name):
    from gpufleet.cli.args import Arg
    from gpufleet.errors import UserError

    try:
        options.options[name].check("nosuch", Arg(f"--{name}"))
    except UserError as exc:
        return str(exc)
    return ""


def test_module_names_name_their_room():
    """Issue 66: twelve module names occurred in more than one package (three `run.py`, two
    `trust.py`, ...), so a search by file name found the wrong room. Each module's file name
    is unique under src/gpufleet (a package's `__init__`/`__main__` excepted)."""
    from collections import Counter

    src = REPO / "src" / "gpufleet"
    names = Counter(
        p.name
        for p in src.rglob("*.py")
        if "__pycache__" not in p.parts and p.name not in ("__init__.py", "__main__.py")
    )
    assert [n for n, count in names.items() if count > 1] == []


def test_where_to_add_names_files_that_exist():
    """Issue 66: docs/ARCHITECTURE.md's "Where to add" says how many files adding an engine,
    a connection, a metric and a task touches and names them; each named file exists (a
    `<name>` part stands for the new module). How many, and which, is what
    tests/test_where_to_add.py touched doing it (issue 82.2: this test compared the counts
    with a dict written here, which could not see the metric's third file)."""
    import re

    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    section = text[text.index("## Where to add") :]
    for kind in ("a task", "an engine", "a connection", "a metric"):
        bullet = section[section.index(f"- **{kind}**") :]
        bullet = bullet[: bullet.index("\n- **", 3)]
        found = re.search(r"Touches (\d+) files?: (.*?)(?:\(|$)", " ".join(bullet.split()))
        assert found, f"{kind}: no 'Touches N files' line"
        files = re.findall(r"`([^`]+)`", found.group(2))
        assert int(found.group(1)) == len(files), (kind, files)
        for name in files:
            if "<" not in name:
                base = REPO if name == "README.md" else REPO / "src" / "gpufleet"
                assert (base / name).exists(), (kind, name)


def test_only_the_archive_names_the_logs_folder():
    """Issue 64.4: control/server/profiles.py spelled the server logs' `logs/` folder as
    well as archive/layout.py. A string that is the folder, or a path in it, lives in
    archive/layout.py alone (the verb `logs` is a word of the agent's contract)."""
    import ast

    verbs = {"host/agent/protocol.py", "host/registry.py"}
    found = []
    src = REPO / "src" / "gpufleet"
    for path in sorted(src.rglob("*.py")):
        rel = str(path.relative_to(src))
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            text = node.value
            if text.startswith("logs/") or (text == "logs" and rel not in verbs):
                found.append(f"{rel}:{node.lineno} {text!r}")
    assert found and all(f.startswith("archive/layout.py:") for f in found), found
