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


def _parse_argv(task: str, words: list[str]) -> dict:
    """What Invoke hands the task for these words."""
    from invoke.parser import Parser

    from gpufleet.cli.tasks import ns

    return Parser(contexts=ns.to_contexts()).parse_argv([task, *words])[0].as_kwargs


def test_the_resume_line_repeats_what_the_task_was_given():
    # derived from the task's declared options: a new option cannot be forgotten in it
    from gpufleet.cli.experiment_context import LEFT_OUT, resume_command
    from gpufleet.cli.sweep_tasks import SWEEP
    from gpufleet.cli.tune_tasks import TUNE

    args = {"profiles": "a,b", "concurrency": ["1,10", "64"], "flush": False,
            "grid": ["speculative-num-steps=1,3", "speculative-eagle-topk=1,4"],
            "prompts": None, "resume": False, "hosts": "h0", "seed": "7",
            "slo": "ttft_ms=500,tpot_ms=50", "archive": "/tmp/a b"}  # fmt: skip
    words = SWEEP.given(SWEEP.parse(args), LEFT_OUT)
    line = resume_command(["inv", "sweep"], words)("hosts/x.yaml", ["h0"])
    assert line == (
        "inv sweep --profiles a,b --concurrency 1,10,64 --seed 7 --slo ttft_ms=500,tpot_ms=50 "
        "--no-flush --archive '/tmp/a b' --grid speculative-num-steps=1,3 "
        "--grid speculative-eagle-topk=1,4 --inventory hosts/x.yaml --hosts h0 --resume"
    )
    again = _parse_argv("sweep", [*words, "--hosts", "h0"])
    assert SWEEP.parse(again) == SWEEP.parse(args)
    tuned = TUNE.parse({"profile": "eagle3", "verify": False, "depths": "1,3"})
    assert TUNE.given(tuned, LEFT_OUT) == ["--profile", "eagle3", "--depths", "1,3", "--no-verify"]
    assert TUNE.parse(_parse_argv("tune", TUNE.given(tuned, LEFT_OUT))) == tuned


def test_every_option_of_an_experiment_survives_the_resume_line():
    """A property over the declaration: each option set to a value other than its default
    comes back from the resume line as it was parsed (a new option is covered unasked)."""
    from gpufleet.cli.experiment_context import LEFT_OUT
    from gpufleet.cli.sweep_tasks import SWEEP
    from gpufleet.cli.tune_tasks import TUNE

    samples = {"concurrency": "2,8", "num_prompts": "9", "output_len": "17",
               "prompts": "chat", "seed": "3", "workload": "multiturn:turns=3",
               "trace": "t.jsonl", "trace_speedup": "2", "random_input_len": "33",
               "random_output_len": "12", "random_range_ratio": "0.5",
               "slo": "ttft_ms=500", "flush": False, "archive": "/tmp/arch",
               "engine": "sim", "allow_unhealthy": True, "fail_fast": True,
               "grid": ["speculative-num-steps=1,3"], "repeat": "2", "forks": "3",
               "depths": "2,4", "min_request_speed": "20", "name": "fast", "budget": "900",
               "backend": "openai", "random_vocab": "512", "budget_may_drop": "depths",
               "shape_rounds": "2", "verify_trace": "mine.jsonl",
               "verify": False, "profile": "eagle3", "profiles": "a,b", "baseline": "a"}  # fmt: skip
    for name, options, base in (("sweep", SWEEP, {"profiles": "a", "concurrency": "1"}),
                                ("tune", TUNE, {"profile": "e"})):  # fmt: skip
        for option in options.options:
            if option in LEFT_OUT:
                continue
            assert option in samples, f"{name} --{option}: add a sample value to this test"
            given = {**base, option: samples[option]}
            parsed = options.parse(given)
            words = options.given(parsed, LEFT_OUT)
            assert options.parse(_parse_argv(name, words)) == parsed, (name, option, words)
