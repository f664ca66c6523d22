"""An agent that ends without its answer, in any verb: where the host's Slurm job ended,
that is the one line (control/connect/base.py `_agent_lost`). scancel while a launch's own
verb ran read only `agent exited with code 143: srun: error: n2: task 0: Terminated`,
because only the long waits asked whether the job had ended."""

from __future__ import annotations

import pytest
import yaml

from gpufleet.control.connect.pool import open_session
from gpufleet.control.inventory.model import load_inventory
from gpufleet.errors import HostError
from gpufleet.host.agent.protocol import EchoArgs
from gpufleet.kinds import Kind

ENDED = "Slurm job 7 was cancelled (CANCELLED): the server and the run on n2 ended with it"


@pytest.fixture
def session(tmp_path, host_python):
    inventory = tmp_path / "local.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": {"h": {
        "connection": "local", "python": host_python, "workdir": str(tmp_path / "work"),
        "gpus": {"count": 8, "simulated": True}}}}))  # fmt: skip
    [host] = load_inventory(inventory).select("all")
    session = open_session(host)
    yield session
    session.close()


def _lose_the_agent(session) -> None:
    session.call(EchoArgs(payload={}))
    agent = session._agent  # the task's serving agent, gone before the next verb
    agent.proc.kill()
    agent.proc.wait()


@pytest.mark.parametrize("job", ["ended", "runs"])
def test_an_agent_lost_in_any_verb_says_its_job_ended_where_it_did(session, job, monkeypatch):
    _lose_the_agent(session)
    monkeypatch.setattr(session, "owner_ended", lambda: ENDED if job == "ended" else None)
    with pytest.raises(HostError) as lost:
        session.call(EchoArgs(payload={}))
    if job == "ended":
        assert lost.value.kind == Kind.JOB_ENDED
        assert str(lost.value).startswith("agent ") and str(lost.value).endswith(ENDED)
    else:  # the job runs on (or there is none, over SSH): the agent's own failure
        assert lost.value.kind == Kind.AGENT and "Slurm job" not in str(lost.value)


def test_a_long_wait_whose_job_ended_gives_no_hint_to_resume(session, monkeypatch):
    _lose_the_agent(session)
    monkeypatch.setattr(session, "owner_ended", lambda: ENDED)
    with pytest.raises(HostError) as lost:
        session.call_resumable(EchoArgs(payload={}), None, 30, "waiting for health",
                               "inv wait --hosts h")  # fmt: skip
    assert lost.value.kind == Kind.JOB_ENDED
    said = str(lost.value)
    assert said.startswith("lost the host while waiting for health (agent ") and ENDED in said
    assert "inv wait" not in said
