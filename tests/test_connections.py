"""One SSH connection, and one agent start, per host per task: counted in a real sshd's
own log (LogLevel DEBUG1 logs each login and each exec request). Each task also opens one
SFTP channel on that connection: the host python is judged over it before it runs
(control/agent/python_trust.py), and uploads and downloads share it."""

from __future__ import annotations

import yaml

from gpufleet.control.connect.fanout import run_on_hosts
from gpufleet.control.connect.pool import for_task
from gpufleet.control.inventory.model import load_inventory
from gpufleet.host.agent.protocol import StatusArgs


class SshdLog:
    """Logins, remote commands and sftp channels an sshd saw since the last `since()`."""

    def __init__(self, sshd) -> None:
        self.path = sshd.directory / "sshd.log"
        self.mark = 0

    def since(self) -> dict[str, int]:
        text = self.path.read_text()
        new, self.mark = text[self.mark :], len(text)
        return {
            "logins": new.count("Accepted publickey for"),
            "commands": new.count("req exec"),
            "sftp": new.count("req subsystem"),
        }


def _counted_host(fleet, fresh_sshd) -> SshdLog:
    sshd = fresh_sshd(log_level="DEBUG1")
    fleet.add_sshd_host("counted", sshd, port_offset=60)
    return SshdLog(sshd)


def test_each_task_uses_one_connection_and_one_agent_per_host(fleet, fresh_sshd, tmp_path):
    log = _counted_host(fleet, fresh_sshd)
    first = fleet.cli("gpu-clean", "--hosts", "counted")
    assert first.returncode == 0, first.stdout + first.stderr
    # the first task asks who it is (`id -u`, for the trust rule: issue 50), uploads the
    # agent (MISSING, one sftp upload), then the agent starts
    assert log.since() == {"logins": 1, "commands": 3, "sftp": 1}

    out = fleet.cli("gpu-clean", "--hosts", "counted")
    assert out.returncode == 0, out.stdout + out.stderr
    assert log.since() == {"logins": 1, "commands": 2, "sftp": 1}  # `id -u`, the python judged

    # clean + launch + wait-ready: three verbs, one login, one agent
    profile = fleet.profile("counted", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    port = yaml.safe_load(profile.read_text())["port"]
    try:
        out = fleet.cli("launch", "--profile", str(profile), "--hosts", "counted", "--clean")
        assert out.returncode == 0, out.stdout + out.stderr
        assert log.since() == {"logins": 1, "commands": 2, "sftp": 1}

        # bench: workdir, prompts upload, bench-start, bench-watch, downloads
        out = fleet.cli(
            "bench", "--hosts", "counted", "--port", str(port + 60), "--concurrency", "1,2",
            "--num-prompts", "4", "--output-len", "8", "--archive", str(tmp_path / "a"),
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        assert log.since() == {"logins": 1, "commands": 2, "sftp": 1}
    finally:
        out = fleet.cli("stop", "--hosts", "counted")
    assert out.returncode == 0, out.stdout + out.stderr
    assert log.since() == {"logins": 1, "commands": 2, "sftp": 1}


def test_a_task_with_several_rounds_reuses_each_hosts_connection(fleet, fresh_sshd):
    """What a sweep does (one round per arm), here three status rounds in one task."""
    log = _counted_host(fleet, fresh_sshd)
    hosts = load_inventory(fleet.inventory).select("counted")
    with for_task() as pool:
        for _ in range(3):
            [res] = run_on_hosts(hosts, lambda s: s.call(StatusArgs()), 1)
            assert res.ok, res.error
    assert pool.opened == 1
    counts = log.since()
    # `id -u`, the agent; 3 with the agent's upload
    assert counts["logins"] == 1 and counts["commands"] in (2, 3)


def test_a_dropped_connection_is_reopened_for_the_next_round(fleet, fresh_sshd):
    log = _counted_host(fleet, fresh_sshd)
    hosts = load_inventory(fleet.inventory).select("counted")
    with for_task() as pool:
        [res] = run_on_hosts(hosts, lambda s: s.call(StatusArgs()), 1)
        assert res.ok, res.error
        [session] = pool._idle.values()
        session.conn.client.get_transport().close()  # the network drops it
        [res] = run_on_hosts(hosts, lambda s: s.call(StatusArgs()), 1)
        assert res.ok, res.error
    assert pool.opened == 2
    assert log.since()["logins"] == 2


def test_each_connection_has_a_fabric_configuration_of_its_own(fleet):
    """One Fabric Config shared by every connection of the fan-out's threads failed a host
    under load (`No attribute or config key found for 'gateway'`): Fabric's Config is
    mutable, and its clone() even re-reads the SSH files into the source. The rule: no
    Fabric object is shared between two connections, and the once-parsed SSH files are
    only ever copied."""
    from gpufleet.control.connect.ssh import _ssh_files, open_connection
    from gpufleet.control.inventory.connections import SshSettings
    from gpufleet.control.inventory.model import load_inventory

    host = load_inventory(fleet.inventory).hosts["h0"]
    a, b = open_connection(SshSettings.of(host)), open_connection(SshSettings.of(host))
    try:
        assert a.config is not b.config
        assert a.config.base_ssh_config is not b.config.base_ssh_config
        rules = len(_ssh_files()._config)
        a.config.clone(), b.config.clone()  # what Fabric does for a ProxyJump from ssh_config
        assert len(_ssh_files()._config) == rules
        assert all(c.run("true", hide=True, in_stream=False).ok for c in (a, b))
    finally:
        a.close()
        b.close()
