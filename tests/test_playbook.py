"""Profiles: extends, flag rendering, the shipped playbooks, multi-node ranks."""

from __future__ import annotations

import shlex

import pytest

from gpufleet.control.inventory.model import Host
from gpufleet.control.server.profiles import build_specs, load_profile
from gpufleet.errors import UserError
from helpers import REPO, dedent

SEED_BASELINE = (
    "--model-path /shared/kimi-k2.5-int4 --tp-size 8 --host 127.0.0.1 --port 30000 "
    "--trust-remote-code --cuda-graph-max-bs 128 --disable-custom-all-reduce "
    "--attention-backend flashinfer --enable-flashinfer-allreduce-fusion"
)


def _host(name: str = "gpu-a", **fields) -> Host:
    return Host(
        name=name,
        address=fields.pop("address", "192.0.2.10"),
        python="/opt/sglang/bin/python",
        **fields,
    )


def test_baseline_reproduces_the_seed_command():
    profile = load_profile("baseline", REPO / "playbooks")
    [(_, spec)] = build_specs(profile, [_host()])
    assert spec.engine == "sglang"
    assert (
        shlex.join(spec.argv) == "/opt/sglang/bin/python -m sglang.launch_server " + SEED_BASELINE
    )
    assert spec.gpus == list(range(8)) and spec.warnings == []


def test_eagle3_extends_baseline_and_sets_max_running_explicitly():
    eagle = load_profile("eagle3", REPO / "playbooks")
    [(_, spec)] = build_specs(eagle, [_host()])
    joined = shlex.join(spec.argv)
    assert SEED_BASELINE in joined
    assert "--speculative-algorithm EAGLE3" in joined and "--max-running-requests 128" in joined
    adaptive = load_profile("eagle3-adaptive", REPO / "playbooks")
    joined = shlex.join(build_specs(adaptive, [_host()])[0][1].argv)
    assert "--speculative-adaptive" in joined and "--speculative-eagle-topk 1" in joined


def test_simulated_hosts_and_engine_override_rehearse_the_same_flags():
    profile = load_profile("baseline", REPO / "playbooks")
    sim_host = _host(gpus={"count": 8, "simulated": True})
    [(_, spec)] = build_specs(profile, [sim_host])
    assert spec.argv[1:3] == ["-m", "gpufleet.sim.server"]
    assert (
        SEED_BASELINE in shlex.join(spec.argv)
        and "--sim-load-seconds 3" in spec.argv[-2:][0] + " " + spec.argv[-1]
    )
    [(_, spec)] = build_specs(profile, [_host()], engine_override="sim")
    assert spec.engine == "sim" and not spec.check_model_path


def test_flag_values_true_false_none_and_lists(tmp_path):
    (tmp_path / "p.yaml").write_text(
        dedent("""
        model_path: /m
        flags: {a: true, b: false, c: null, d: [1, 2], e: 0.5}
        env: {X: 1, Y: true}
        gpus: [2, 3]
    """)
    )
    [(_, spec)] = build_specs(load_profile("p", tmp_path), [_host()])
    assert spec.argv[spec.argv.index("--port") + 2 :] == [
        "--a",
        "--d",
        "1",
        "--d",
        "2",
        "--e",
        "0.5",
    ]
    # the host sets CUDA_VISIBLE_DEVICES from what its server would see (placement.py)
    assert spec.env == {"X": "1", "Y": "true"}
    assert spec.gpus == [2, 3] and spec.gpus_pinned


def test_speculative_without_max_running_warns_about_the_silent_cap(tmp_path):
    (tmp_path / "s.yaml").write_text("model_path: /m\nflags: {speculative-algorithm: EAGLE3}\n")
    [(_, spec)] = build_specs(load_profile("s", tmp_path), [_host()])
    assert "silently caps it at 48" in spec.warnings[0]


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"a": "extends: b\n", "b": "extends: a\nmodel_path: /m\n"}, "extends: cycle a -> b -> a"),
        ({"a": "extends: ghost\nmodel_path: /m\n"}, "a.yaml: extends: unknown profile 'ghost'"),
        (
            {"a": "model_path: /m\nflags: {--tp: 2}\n"},
            "a.yaml: flags: flag name '--tp'",
        ),
        (
            {"a": "model_path: /m\nport: 99999\n"},
            "a.yaml: port: Input should be less than or equal",
        ),
        (
            {"a": "model_path: /m\nlog: /etc/passwd\n"},
            "a.yaml: log: must be a relative",
        ),
        ({"a": "model_path: /m\nengine: custom\n"}, "engine custom needs `command`"),
        ({"a": "tp: 2\n"}, "a.yaml: model_path: required key is missing"),
        ({"a": "model_path: /m\nenv: {'BAD NAME': 1}\n"}, "environment variable name 'BAD NAME'"),
    ],
)
def test_bad_profiles(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    with pytest.raises(UserError) as err:
        load_profile("a", tmp_path)
    assert expected in str(err.value)


def test_multi_node_ranks_and_dist_init_addr(tmp_path):
    (tmp_path / "mn.yaml").write_text("model_path: /m\ntp: 16\nnnodes: 2\ndist_init_port: 5757\n")
    hosts = [_host("n0", address="192.0.2.20"), _host("n1", address="192.0.2.21")]
    specs = build_specs(load_profile("mn", tmp_path), hosts)
    for rank, (_, spec) in enumerate(specs):
        joined = shlex.join(spec.argv)
        assert f"--nnodes 2 --node-rank {rank}" in joined
        assert "--dist-init-addr 192.0.2.20:5757" in joined
        assert spec.node_rank == rank and spec.gpus == list(range(8))
    with pytest.raises(UserError, match="select a multiple of 2 hosts"):
        build_specs(load_profile("mn", tmp_path), hosts[:1])


def test_every_shipped_profile_is_valid():
    from gpufleet.control.server.profiles import list_profiles

    items = list_profiles(REPO / "playbooks")
    assert len(items) >= 6 and all(not isinstance(i, UserError) for i in items)
