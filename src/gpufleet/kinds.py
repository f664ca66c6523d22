"""The words every layer routes on: why a host failed (Kind) and the states of servers,
runs, sweep cells and sweeps. Shipped in the zipapp beside host/ and sim/.

On the wire and in state files they are plain strings (`{"ok": false, "kind": ...}`,
`"status": "done"`); in code they are always members of these enums, so a typo is an
AttributeError, not a silently different route. StrEnum members compare equal to their
strings, so older state files read as before. Standard library only: this module ships.
"""

from __future__ import annotations

from enum import StrEnum


class Kind(StrEnum):
    ERROR = "error"  # unclassified
    AGENT = "agent"  # the agent did not answer (exited, no result line)
    AUTH = "auth"  # SSH authentication failed
    BAD_INPUT = "bad_input"  # arguments the agent refuses (a pattern, a run id)
    CANCELLED = "cancelled"  # the user asked to stop (Ctrl-C)
    CONNECTION = "connection"  # the SSH connection was lost
    CRASH = "crash"  # a bug: an exception escaped (its traceback is reported)
    CRASHED = "crashed"  # the server crashed while starting
    EXISTS = "exists"  # a run of that id is already on the host
    GPU_COUNT = "gpu_count"  # NVML sees another number of GPUs than the inventory says
    HOST_KEY = "host_key"  # unknown or changed host key
    LOCKED = "locked"  # another launch on that port is in progress
    JOB_ENDED = "job_ended"  # the Slurm job the host's server and run were steps of ended
    IN_USE = "in_use"  # another gpufleet task holds the host (host/agent/ownership.py)
    MISSING_PACKAGE = "missing_package"  # the host Python lacks psutil / nvidia-ml-py
    NO_DRIVER = "no_driver"  # no NVIDIA driver (NVML not found)
    NO_RUN = "no_run"  # no benchmark run of that id on the host
    NO_SERVER = "no_server"  # no server launched by gpufleet matches
    NOT_CLEAN = "not_clean"  # GPUs do not read 0 MiB after cleaning or stopping
    PREFLIGHT = "preflight"  # the launch preflight refused
    RUN_FAILED = "run_failed"  # the benchmark run finished failed
    TIMEOUT = "timeout"  # the server did not become healthy in time
    UNHEALTHY = "unhealthy"  # a GPU reads `bad` (gpu-clean verified its memory; not its fitness)
    UNREACHABLE = "unreachable"  # the host cannot be reached over SSH
    UNSAFE_WORKDIR = "unsafe_workdir"  # the workdir path or agent file is not safe to run
    UNTRUSTED = "untrusted"  # a path root would run, import or write fails the trust rule
    USAGE = "usage"  # a usage mistake the agent detected
    WORKDIR = "workdir"  # the workdir cannot be created


class ServerStatus(StrEnum):
    """A launched server's state file (`servers/<port>.json`) and `inv status`."""

    STARTING = "starting"
    READY = "ready"  # /health answered 200
    RUNNING = "running"  # no health endpoint: the process runs
    FAILED = "failed"  # crashed or timed out while starting
    STOPPED = "stopped"
    STALE = "stale"  # its PID now belongs to another process
    DEAD = "dead"  # it was up; its process is gone (shown, never stored)

    @property
    def ended(self) -> bool:
        return self in (ServerStatus.STOPPED, ServerStatus.STALE)


class RunStatus(StrEnum):
    """A benchmark run's status.json on the host, and its manifest."""

    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    WATCHING = "watching"  # bench-watch returned before the run ended (a slice)


class CellStatus(StrEnum):
    """One sweep cell (a profile or grid point on a host), in the sweep state file."""

    PENDING = "pending"
    CLEANING = "cleaning"
    LAUNCHING = "launching"
    BENCHING = "benching"  # the run goes on on the host even if the sweep is interrupted
    ARCHIVED = "archived"
    STOPPING = "stopping"
    DONE = "done"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    DROPPED = "dropped"  # left out by inv tune's --budget (said, never run)


class SweepStatus(StrEnum):
    RUNNING = "running"
    DONE = "done"
    INTERRUPTED = "interrupted"
    INCOMPLETE = "incomplete"  # some cell failed: --resume retries it
