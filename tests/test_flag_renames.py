"""Profiles work on the host's own SGLang: known flag renames are applied from its real
`--help` (captured from SGLang releases in throwaway venvs: tests/fixtures/sglang-help/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.control.inventory.model import Host
from gpufleet.control.server.profiles import build_specs, list_profiles
from gpufleet.host.server.preflight import check_flags_against

HELP = Path(__file__).parent / "fixtures" / "sglang-help"
VERSIONS = sorted(p.stem for p in HELP.glob("*.txt"))
SHIPPED = [p for p in list_profiles() if not isinstance(p, Exception) and p.engine == "sglang"]
GPU_HOST = Host(name="gpu1", address="192.0.2.10", python="/opt/sglang/bin/python")


def _check(profile, version):
    [(_, spec)] = build_specs(profile, [GPU_HOST])
    return check_flags_against(  # the renames the spec carries: SGLang's adapter's
        spec.argv,
        spec.flags_from,
        (HELP / f"{version}.txt").read_text(),
        f"sglang {version}",
        spec.renames,
    )


# Adaptive speculation arrived in 0.5.x: on 0.4.x that profile must be refused, by name.
NOT_YET = {("eagle3-adaptive", "0.4.10.post2"): ["--speculative-adaptive"]}


def test_there_are_help_texts_spanning_releases():
    assert {"0.4.10.post2", "0.5.16", "0.5.23"} <= set(VERSIONS)
    assert {p.name for p in SHIPPED} >= {"baseline", "eagle3", "eagle3-adaptive"}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("profile", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_profile_preflights_on_every_captured_release(profile, version):
    check = _check(profile, version)
    missing = NOT_YET.get((profile.name, version), [])
    expected = [f"{flag} is not accepted by this engine version" for flag in missing]
    assert check.errors == expected, f"{profile.name} on sglang {version}: {check.errors}"


def test_the_seeds_flags_are_renamed_on_0_5_23_with_a_note():
    [baseline] = [p for p in SHIPPED if p.name == "baseline"]
    check = _check(baseline, "0.5.23")
    assert "--cuda-graph-max-bs-decode" in check.argv and "--cuda-graph-max-bs" not in check.argv
    assert check.argv[check.argv.index("--cuda-graph-max-bs-decode") + 1] == "128"
    assert "--flashinfer-allreduce-fusion-backend" in check.argv
    assert "--enable-flashinfer-allreduce-fusion" not in check.argv
    assert check.renames[0].startswith(
        "--cuda-graph-max-bs -> --cuda-graph-max-bs-decode on sglang 0.5.23"
    )
    assert not any("deprecated" in w for w in check.warnings)


def test_an_unknown_or_ambiguous_flag_without_a_rename_still_fails_with_candidates():
    text = (HELP / "0.5.23.txt").read_text()
    argv = ["python", "-m", "sglang.launch_server", "--cuda-graph-bs", "8", "--no-such-flag"]
    check = check_flags_against(argv, 3, text, "sglang 0.5.23")
    assert check.errors == [
        "--cuda-graph-bs is ambiguous here (could be --cuda-graph-bs-decode, "
        "--cuda-graph-bs-prefill)",
        "--no-such-flag is not accepted by this engine version",
    ]


def test_launch_on_a_host_with_sglang_0_5_23_renames_and_records(fleet, tmp_path):
    """End to end over sshd: the host's `sglang` answers --help with the real 0.5.23 text
    (and serves with the rehearsal engine); the seeds' baseline flags are renamed, noted,
    launched and recorded in the state the manifest is built from."""
    import json

    import yaml

    from helpers import REPO

    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "launch_server.py").write_text(
        "import sys\n"
        "if '--help' in sys.argv:\n"
        f"    print(open({str(HELP / '0.5.23.txt')!r}).read()); sys.exit(0)\n"
        f"sys.path.insert(0, {str(REPO / 'src')!r})\n"
        "from gpufleet.sim.server import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    meta = site / "sglang-0.5.23.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    # sglang importable through the profile's own PYTHONPATH (root's children never get
    # the login's, and a python: that is a wrapper script is refused: issue 34)
    profile = fleet.profile(
        "seeds", engine="sglang", tp=1, check_model_path=False, env={"PYTHONPATH": str(site)},
        flags={"cuda-graph-max-bs": 128, "enable-flashinfer-allreduce-fusion": True},
    )  # fmt: skip
    port = yaml.safe_load(profile.read_text())["port"]
    # the dry run shows what will run on that host: the argv after its renames
    dry = fleet.cli(
        "launch", "--profile", str(profile), "--engine", "sglang", "--hosts", "h0", "--dry-run"
    )
    assert dry.returncode == 0, dry.stdout + dry.stderr
    [argv] = [ln for ln in dry.stdout.splitlines() if ln.startswith("h0: argv: ")]
    assert "--cuda-graph-max-bs-decode 128" in argv and "--cuda-graph-max-bs " not in argv
    assert "h0: note: --cuda-graph-max-bs -> --cuda-graph-max-bs-decode" in dry.stdout
    out = fleet.cli("launch", "--profile", str(profile), "--engine", "sglang", "--hosts", "h0")
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        assert (
            "h0: note: --cuda-graph-max-bs -> --cuda-graph-max-bs-decode on sglang 0.5.23"
            in out.stdout
        )
        assert "--flashinfer-allreduce-fusion-backend auto on sglang 0.5.23" in out.stdout
        state = json.loads((fleet.workdir("h0") / "servers" / f"{port}.json").read_text())
        assert "--cuda-graph-max-bs-decode" in state["argv"] and len(state["flag_renames"]) == 2
        assert state["engine_version"] == "0.5.23"
    finally:
        fleet.cli("stop", "--hosts", "h0")
