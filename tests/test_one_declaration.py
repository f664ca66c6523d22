"""Issue 82, bullet 4: one declaration per option, one copy of the request. A bench option's
help and default are its BenchRequest field's (as vLLM's arg_utils derives flags from its
config dataclasses); the task's Option adds only how a value is checked. The plan is built
from the request in one place (wire.carried), so a field both declare is carried without a
line of its own, and so are the clean options' into the verb's arguments, the profile's into
the launch spec and the plan's into a level's spec.

Before: each request option's help was written in cli/common_options.py beside the field it
set, and control/bench/run.py copied the request into the plan field by field (as
control/server/host_options.py and profiles.py did theirs): the rows `duplicates` found."""

from __future__ import annotations

import ast
import dataclasses
import inspect

from gpufleet.cli.bench_tasks import BENCH
from gpufleet.cli.common_options import experiment_options, request_options
from gpufleet.cli.options import Option, OptionSet
from gpufleet.control.bench import run
from gpufleet.control.bench.request import BenchRequest, option
from gpufleet.control.server import host_options, profiles
from gpufleet.records import BenchPlan
from gpufleet.wire import carried

FIELDS = {f.name: f for f in dataclasses.fields(BenchRequest)}


def _request_options(options: OptionSet) -> dict[str, Option]:
    return {
        name: o
        for name, o in options.options.items()
        if o.to_request and (o.field or name) in FIELDS and name != "archive"
    }


def test_a_request_option_says_its_field_help_and_default():
    """Every option that sets a request field, in every task built on the request, has no
    help of its own: the field declares it, and the task's help says it with the default."""
    for options in (BENCH, request_options(), experiment_options()):
        said = options.help()
        for name, opt in _request_options(options).items():
            field = FIELDS[opt.field or name]
            assert opt.help == "", f"--{name} declares its help twice"
            assert field.metadata.get("help"), f"BenchRequest.{field.name} declares no help"
            assert said[name.replace("_", "-")].startswith(field.metadata["help"])


def test_build_plan_copies_no_field_by_hand():
    """No `name=request.name` line in build_plan, CleanOptions.agent_args or the launch
    spec's build: a field the two types share is carried by name."""
    copies = []
    for where, function, source in (
        ("run.build_plan", run.build_plan, "request"),
        ("host_options.agent_args", host_options.CleanOptions.agent_args, "self"),
        ("profiles._spec_for", profiles._spec_for, "profile"),
    ):
        for node in ast.walk(ast.parse(inspect.getsource(function).lstrip())):
            value = node.value if isinstance(node, ast.keyword) else None
            if (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                    and value.value.id == source and value.attr == node.arg):  # fmt: skip
                copies.append(f"{where}: {node.arg}")
    assert copies == []


def test_the_plan_carries_every_field_it_shares_with_the_request():
    shared = {f.name for f in dataclasses.fields(BenchPlan)} & set(FIELDS)
    request = BenchRequest(
        concurrency=[2], port=8123, num_prompts=3, request_rate=4.0, output_len=17,
        warmup=2, seed=9, flush_cache=False, output_details=True, client_procs=2,
        tokenizer="/models/tok", telemetry_interval_s=0.25, backend="openai", metrics=False,
        duration=5.0, slo={"ttft_ms": 500.0},
    )  # fmt: skip
    plan, _ = run.build_plan(request, "r1")
    transformed = {"profile", "workload"}  # a label, the workload's canonical name
    for name in shared - transformed:
        assert getattr(plan, name) == getattr(request, name), name


def test_a_new_option_is_one_field_on_each_side():
    """A field added to the request and the plan at run time: its help and default reach
    the task's help, its parsed value the request, and the request's the plan, with no
    other line written."""

    @dataclasses.dataclass
    class Asked(BenchRequest):
        top_p: float = option(0.9, help="nucleus sampling share")

    @dataclasses.dataclass
    class Planned(BenchPlan):
        top_p: float = 1.0

    options = OptionSet(Asked, top_p=Option(), concurrency=Option())
    assert options.help()["top-p"] == "nucleus sampling share (default 0.9)"
    request = options.request(options.parse({"top_p": 0.5, "concurrency": [1]}))
    assert (request.top_p, carried(Planned, request, run_id="r", levels=[]).top_p) == (0.5, 0.5)
