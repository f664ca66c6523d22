"""Which GPUs a server will really run on, in NVML's numbering.

CUDA counts only the GPUs `CUDA_VISIBLE_DEVICES` lists, in that order; NVML, and so
gpufleet's busy check, gpu-clean, telemetry and the stop's verification, counts every GPU
of the host by PCI bus id. A login (or a Slurm step) that sets `CUDA_VISIBLE_DEVICES=2,3`
makes the server's GPU 0 NVML's GPU 2: checking NVML's GPU 0 would check the wrong card.
So a profile's GPU numbers are read as the server's CUDA reads them, from the variable
the server will get, and turned into NVML indexes here, where NVML is: an entry is an
index (PCI bus order: the server gets CUDA_DEVICE_ORDER=PCI_BUS_ID unless it sets its
own) or a GPU's UUID, whole or a unique prefix, as CUDA accepts it. Standard library
only: this module ships.
"""

from __future__ import annotations

from dataclasses import dataclass

VARIABLE = "CUDA_VISIBLE_DEVICES"


class PlacementError(ValueError):
    """One line: the GPUs a profile asks for cannot be found as the server would see them."""


@dataclass(frozen=True)
class Placement:
    """The server's GPUs in NVML's numbering, and the CUDA_VISIBLE_DEVICES it gets (None:
    the variable it would get anyway stays as it is)."""

    nvml: list[int]
    variable: str | None


def entries(value: str) -> list[str]:
    """CUDA's reading of the variable: comma-separated, blanks ignored; CUDA stops at the
    first entry that is not a device (`-1` is the documented way to hide every GPU)."""
    out = []
    for word in value.split(","):
        word = word.strip()
        if not word or word.startswith("-"):
            break
        out.append(word)
    return out


def nvml_index(entry: str, uuids: list[str], where: str) -> int:
    """The NVML index of one entry: a number is itself; a UUID (or a unique prefix of
    one, `GPU-` included) is the GPU that carries it."""
    if entry.isdigit():
        index = int(entry)
        if index >= len(uuids):
            raise PlacementError(
                f"{where} names GPU {index}, but NVML sees {len(uuids)} GPU(s) on this host"
            )
        return index
    if entry.startswith("MIG-"):
        raise PlacementError(
            f"{where} names a MIG instance ({entry}); gpufleet checks and cleans whole GPUs: "
            "name the GPU (its index or GPU-UUID)"
        )
    found = [i for i, u in enumerate(uuids) if u.startswith(entry)]
    if len(found) != 1:
        why = "no GPU" if not found else f"{len(found)} GPUs"
        raise PlacementError(
            f"{where} entry {entry!r} matches {why} by UUID (NVML sees {', '.join(uuids)})"
        )
    return found[0]


def every_seen(seen: str | None, uuids: list[str]) -> list[int]:
    """CUDA's numbers of every GPU a server would see: the variable's entries, else all of
    NVML's (an engine that spreads over whatever it sees: llama.cpp's default split)."""
    return list(range(len(entries(seen)) if seen is not None else len(uuids)))


def place(wanted: list[int], pinned: bool, seen: str | None, where: str,
          uuids: list[str]) -> Placement:  # fmt: skip
    """The server's GPUs in NVML's numbering.

    `wanted` are CUDA's numbers (the profile's `gpus`, else the first tp of them); `pinned`
    says the profile named them, so the server gets a CUDA_VISIBLE_DEVICES listing exactly
    those, taken from what it would see (`seen`: the variable from its environment, None
    where unset: every GPU); `where` says where `seen` came from, for the one line.
    """
    if seen is None:
        listed = [str(i) for i in range(len(uuids))]
    else:
        listed = entries(seen)
        where = f"{VARIABLE}={seen} ({where})"
    beyond = [i for i in wanted if i >= len(listed)]
    if beyond:
        count = f"{len(listed)} GPU(s)" + (f" (0-{len(listed) - 1})" if listed else "")
        shown = f"{where} shows the server {count}" if seen is not None else f"NVML sees {count}"
        raise PlacementError(f"the profile asks for GPU {beyond[0]}, but {shown}")
    nvml = [nvml_index(listed[i], uuids, where) for i in wanted]
    if len(set(nvml)) != len(nvml):
        raise PlacementError(f"{where} lists one GPU twice for this server: NVML {nvml}")
    return Placement(nvml, ",".join(listed[i] for i in wanted) if pinned else None)
