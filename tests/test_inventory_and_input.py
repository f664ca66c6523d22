"""Inventory parsing and bad input: one clear line, exit code 2, never a traceback."""

from __future__ import annotations

import json

import pytest

from gpufleet.control.inventory.model import load_inventory
from gpufleet.errors import UserError
from helpers import REPO, dedent, run_cli


def _write(tmp_path, text: str):
    path = tmp_path / "inv.yaml"
    path.write_text(dedent(text))
    return path


def test_defaults_groups_and_selection(tmp_path):
    inv = load_inventory(
        _write(
            tmp_path,
            """
            defaults: {user: ml, port: 2222, gpus: {count: 8}}
            hosts:
              a: {address: 192.0.2.1}
              b: {address: 192.0.2.2, port: 22, gpus: {simulated: true}}
              c:
            groups:
              rack: [a, b]
              everything: [rack, c]
            """,
        )
    )
    assert [h.name for h in inv.select("everything")] == ["a", "b", "c"]
    assert [h.name for h in inv.select("c, rack")] == ["c", "a", "b"]
    assert [h.name for h in inv.select(None)] == ["a", "b", "c"]
    b = inv.hosts["b"]
    assert (b.user, b.port, b.gpus.count, b.gpus.simulated) == ("ml", 22, 8, True)
    assert inv.hosts["c"].address == "c"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hosts: {a: {port: abc}}", "inv.yaml: hosts.a.port: Input should be a valid integer"),
        ("hosts: {a: {prot: 22}}", "inv.yaml: hosts.a.prot: unknown key"),
        (
            "hosts: {a: {connection: telnet}}",
            "inv.yaml: hosts.a.connection: Input should be 'ssh', 'local' or 'srun'",
        ),
        (
            "hosts: {a: {gpus: {count: -1}}}",
            "inv.yaml: hosts.a.gpus.count: Input should be greater",
        ),
        ("hosts: [a, b]", "inv.yaml: hosts: Input should be a valid dictionary"),
        ("groups: {g: [nope]}", "inv.yaml: groups.g: unknown host or group 'nope'"),
        ("hosts: {a: {}}\ngroups: {g: [h], h: [g]}", "groups.g: group includes itself"),
        ("hosts: {a: {port: 22\n", "inv.yaml: malformed YAML at line"),
        ("- just\n- a list\n", "expected a mapping with defaults/hosts/groups"),
    ],
)
def test_bad_inventory_is_one_clear_line(tmp_path, text, expected):
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        load_inventory(path)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--hosts", "ghost"], "unknown host or group 'ghost'"),
        (["--hosts", "sim-h200,,x"], "empty name in the list"),
        (["--timeout", "soon"], "--timeout 'soon': expected a number of seconds"),
        (["--timeout", "-5"], "--timeout '-5': expected a positive number"),
        (["--tolerance", "x"], "--tolerance 'x': expected a whole number"),
        (["--inventory", "nowhere"], "inventory 'nowhere' not found"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(args, expected):
    out = run_cli("gpu-clean", *args, timeout=60)
    assert out.returncode == 2, out.stderr
    assert expected in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_malformed_yaml_via_cli(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("hosts:\n  a: {port: [\n")
    out = run_cli("status", "--inventory", str(path))
    assert out.returncode == 2
    assert f"{path}: malformed YAML at line" in out.stderr
    assert "Traceback" not in out.stderr


def test_missing_host_python_is_one_line(tmp_path):
    path = _write(
        tmp_path,
        f"""
        hosts:
          box: {{connection: local, python: /nonexistent/bin/python, workdir: {tmp_path}/w,
                 gpus: {{count: 8, simulated: true}}}}
        """,
    )
    out = run_cli("status", "--inventory", str(path))
    assert out.returncode == 1
    assert "box: FAILED: python '/nonexistent/bin/python' not found on the host" in out.stderr
    assert "Traceback" not in out.stderr


def test_concurrency_lists():
    from gpufleet.cli.bench_tasks import BENCH
    from gpufleet.cli.server_tasks import STOP

    def levels(value):
        return BENCH.parse({"concurrency": value}).concurrency

    assert levels("1,10,64") == [1, 10, 64]
    assert levels(["1", "10,64", "10"]) == [1, 10, 64]
    for bad, msg in (
        ("1,,x", "empty value"),
        ("0", "must be at least 1"),
        ("-3", "at least 1"),
        ("x", "not a whole number"),
        ("1,100001", "at most 100000"),
    ):
        with pytest.raises(UserError, match=f"--concurrency .*{msg}"):
            levels(bad)
    with pytest.raises(UserError, match="--timeout 'nan': expected a positive number"):
        STOP.parse({"timeout": "nan"})


def _task_sets():
    from gpufleet.cli.tasks import option_sets

    return option_sets()


def test_every_checked_option_is_bounded():
    """A census over every task's declared options: an option that refuses a word is a
    checked one, and a checked one refuses a number far too large (a typo cannot run for
    ten minutes into 21 GB of memory), in one line naming its flag."""
    required = {"first": "a", "second": "b", "profile": "p", "profiles": "a",
                "concurrency": "1", "runs": "a"}  # fmt: skip
    checked = 0
    for task, options in _task_sets().items():
        base = {n: v for n, v in required.items() if n in options.options}
        for name, option in options.options.items():
            if option.flag_default is not None or name == "grid":
                continue  # a switch; --grid is checked against the profile's flags
            flag = "--" + name.replace("_", "-")
            try:
                options.parse({**base, name: "abc"})
            except UserError as exc:
                if not str(exc).startswith(f"{flag} "):
                    continue  # a rule about the combination, not this value
                checked += 1
                with pytest.raises(UserError, match=f"^{flag} ") as refused:
                    options.parse({**base, name: "999999999999"})
                assert "\n" not in str(refused.value), (task, name)
    assert checked > 40  # every number of every task (the sets share most of them)


def test_rehearsal_inventory_cleans_locally():
    out = run_cli("gpu-clean", "--inventory", str(REPO / "hosts/rehearsal.yaml"))
    assert out.returncode == 0, out.stderr
    assert "sim-h200: verified clean" in out.stdout
    rows = [ln.split() for ln in out.stdout.splitlines() if ln.startswith("sim-h200 ")]
    assert [r[-2:] for r in rows] == [["clean", "ok"]] * 8  # verdict, health


def test_sysinfo_reports_each_host_as_json():
    out = run_cli("sysinfo", "--inventory", str(REPO / "hosts/rehearsal.yaml"))
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout)["sim-h200"]
    assert facts["simulated"] is True and len(facts["gpus"]) == 8
    assert facts["gpus"][0]["name"] == "NVIDIA H200"


def test_every_task_is_run_by_a_test():
    """A census over the collection: each task is typed, as a user types it, by some test
    (`inv rehearse` and `inv sysinfo` were not, and a broken one went unseen)."""
    import re

    from gpufleet.cli.tasks import ns

    text = "\n".join(p.read_text() for p in (REPO / "tests").glob("test_*.py"))
    for name in ns.task_names:
        typed = re.search(rf"""(cli|run_cli|_start|_parse_argv)\(\s*"{name}"|\["{name}"|"{name}",""",
                          text)  # fmt: skip
        assert typed, f"inv {name}: no test runs it"


def test_shipped_inventories_parse():
    for name in ("local", "rehearsal", "example"):
        inv = load_inventory(REPO / "hosts" / f"{name}.yaml")
        assert inv.hosts
    example = load_inventory(REPO / "hosts/example.yaml")
    assert all(
        h.address.startswith("192.0.2.") or h.address == "gpu-b2" for h in example.hosts.values()
    )
    assert [h.name for h in example.select("all-racks")] == [
        "gpu-a1",
        "gpu-a2",
        "gpu-b1",
        "bastion-box",
    ]


def test_inv_list_is_fast_and_lazy():
    import subprocess
    import sys

    code = (
        "import sys, time; t=time.perf_counter(); import gpufleet.cli.tasks; "
        "heavy=[m for m in ('fabric','paramiko','pydantic','rich','aiohttp') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--request-rate", "abc"], "--request-rate 'abc': expected a rate in requests per second"),
        (["--trace-speedup", "x"], "--trace-speedup 'x': expected a factor"),
        (["--duration", "soon"], "--duration 'soon': expected a number of seconds"),
    ],
)
def test_a_bad_number_says_what_it_should_be(args, expected):
    # was: "--request-rate 'abc': expected a number of seconds, such as 60"
    out = run_cli("bench", "-c", "1", "--client", "local", "--url", "http://192.0.2.1:1", *args)
    assert out.returncode == 2 and expected in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
