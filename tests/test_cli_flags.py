"""One meaning per short flag, -h always help, Invoke's parse errors one line and exit 2."""

from __future__ import annotations

import pytest

from gpufleet.cli.tasks import ns
from helpers import run_cli


def _flags() -> dict[str, dict[str, str]]:
    """task -> {short flag: long name} as the parser sees them."""
    out: dict[str, dict[str, str]] = {}
    for name in ns.task_names:
        task = ns[name]
        shorts = {}
        for arg in task.get_arguments():
            for alias in arg.names[1:]:
                shorts[alias] = arg.names[0]
        out[name] = shorts
    return out


def test_every_short_flag_means_one_thing_in_every_task_and_h_is_help():
    meaning: dict[str, tuple[str, str]] = {}
    for task, shorts in _flags().items():
        assert "h" not in shorts, f"inv {task}: -h is --{shorts['h']}, not help"
        for short, long in shorts.items():
            first = meaning.setdefault(short, (long, task))
            assert first[0] == long, (
                f"-{short} is --{long} in {task} but --{first[0]} in {first[1]}"
            )
    # the letters users type most are there
    assert _flags()["bench"] == {
        "a": "archive", "c": "concurrency", "f": "forks", "H": "hosts", "i": "inventory",
        "p": "profile",
    }  # fmt: skip


@pytest.mark.parametrize("task", ["tune", "compare", "bench", "gpu-clean", "report"])
@pytest.mark.parametrize("word", ["--help", "-h"])
def test_help_after_any_task_shows_its_help(task, word):
    out = run_cli(task, word)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Usage: gpufleet [--core-opts] " + task)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["bench", "--nope"], "gpufleet: No idea what '--nope' is!"),
        (["gpu-clean", "--hosts"], "gpufleet: Flag --hosts needed value and was not given one!"),
        (["bench", "-x"], "gpufleet: No idea what '-x' is!"),
    ],
)
def test_parse_errors_are_one_line_and_exit_2(argv, expected):
    out = run_cli(*argv)
    assert out.returncode == 2
    assert out.stderr.strip() == expected


def test_the_resume_line_repeats_what_the_task_was_given():
    # derived from the task's own signature: a new option cannot be forgotten in it
    from gpufleet.cli.experiments import given_options, resume_command
    from gpufleet.cli.sweep_tasks import sweep
    from gpufleet.cli.tune_tasks import tune

    class Inv:
        source = "hosts/x.yaml"

    args = {"c": None, "profiles": "a,b", "concurrency": ["1,10", "64"], "flush": False,
            "grid": ["speculative-num-steps=1,3"], "prompts": None, "resume": False,
            "hosts": "h0", "seed": "7"}  # fmt: skip
    line = resume_command(["inv", "sweep"], given_options(sweep.body, args))(Inv(), ["h0"])
    assert line == (
        "inv sweep --profiles a,b --concurrency 1,10 --concurrency 64 --seed 7 --no-flush "
        "--grid speculative-num-steps=1,3 --inventory hosts/x.yaml --hosts h0 --resume"
    )
    tuned = given_options(tune.body, {"profile": "eagle3", "verify": False, "depths": "1,3"})
    assert tuned == {"--profile": "eagle3", "--depths": "1,3", "--no-verify": True}
