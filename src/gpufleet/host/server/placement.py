"""The launch's GPUs as the server will see them, put in NVML's numbering before anything
checks them (host/gpu/visible.py says why): the busy check, the state file, telemetry,
the stop's verification and gpu-clean then all look at the cards the server really holds."""

from __future__ import annotations

import dataclasses

from gpufleet.host.agent import childenv
from gpufleet.host.agent.protocol import AgentError
from gpufleet.host.gpu import nvml as nvmlread
from gpufleet.host.gpu import visible
from gpufleet.kinds import Kind
from gpufleet.records import LaunchSpec

ORDER = "CUDA_DEVICE_ORDER"


def placed(spec: LaunchSpec) -> LaunchSpec:
    """The spec with `gpus` as NVML indexes and the server's CUDA variables set so CUDA
    counts as NVML does; one line (AgentError) where the GPUs asked for cannot be found."""
    if not (spec.gpus or spec.gpus_every) or not spec.needs_gpu:
        return spec
    login, _ = childenv.login_env()
    seen = spec.env.get(visible.VARIABLE, login.get(visible.VARIABLE))
    where = "the profile's env" if visible.VARIABLE in spec.env else "the login environment"
    try:
        uuids = nvmlread.uuids(nvmlread.load_pynvml())
    except AgentError:
        if spec.gpus_every:  # which GPUs it will hold is NVML's to say: none checked is none
            raise
        if seen is not None:  # not checkable here: preflight says NVML's own error
            return spec
        uuids = [""] * (max(spec.gpus) + 1)
    wanted = visible.every_seen(seen, uuids) if spec.gpus_every else spec.gpus
    if not wanted:
        said = f"{visible.VARIABLE}={seen} ({where})"
        raise AgentError(f"GPUs: the server would see no GPU ({said}) but its flags put work "
                         "on one", kind=Kind.PREFLIGHT)  # fmt: skip
    try:
        place = visible.place(wanted, spec.gpus_pinned, seen, where, uuids)
    except visible.PlacementError as exc:
        raise AgentError(f"GPUs: {exc}", kind=Kind.PREFLIGHT) from None
    env = dict(spec.env)
    if place.variable is not None:
        env[visible.VARIABLE] = place.variable
    if ORDER not in env and ORDER not in login:
        env[ORDER] = "PCI_BUS_ID"  # CUDA's default is fastest first; NVML's is the bus
    return dataclasses.replace(spec, gpus=place.nvml, env=env)
