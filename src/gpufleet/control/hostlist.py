"""Slurm's host list syntax (`gpu[01-16,20]`, `rack[1-2]-n[1-4]`, `a1,b[2-3]`), expanded the
way `scontrol show hostnames` does: ranges keep their zero padding, several bracket groups
multiply, commas outside brackets separate lists. Works without Slurm; where Slurm is
installed, a job's allocation or a partition's nodes come from its own commands.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from gpufleet.errors import UserError

MAX_HOSTS = 100_000  # a typo such as gpu[1-9999999] is refused, not expanded
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """Split at commas that are outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise UserError(f"host list {text!r}: nested brackets")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UserError(f"host list {text!r}: ']' without '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise UserError(f"host list {text!r}: '[' without ']'")
    parts.append(text[start:])
    return parts


def _numbers(body: str, whole: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        match = _RANGE.match(item.strip())
        if not match:
            raise UserError(
                f"host list {whole!r}: {item!r} in [{body}] is not a number or a range "
                "such as 01-16"
            )
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise UserError(f"host list {whole!r}: range {item} goes down")
        if int(high) - int(low) >= MAX_HOSTS:
            raise UserError(f"host list {whole!r}: range {item} is over {MAX_HOSTS} hosts")
        width = len(low) if low.startswith("0") and len(low) > 1 else 0
        out += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return out


def _expand_one(pattern: str, whole: str) -> list[str]:
    names = [""]
    for piece in re.split(r"(\[[^\]]*\])", pattern):
        if piece.startswith("["):
            values = _numbers(piece[1:-1], whole)
            names = [n + v for n in names for v in values]
        else:
            names = [n + piece for n in names]
        if len(names) > MAX_HOSTS:
            raise UserError(f"host list {whole!r}: over {MAX_HOSTS} hosts")
    return names


def expand(text: str) -> list[str]:
    """Every host name of a Slurm host list, in order, duplicates dropped."""
    text = text.strip()
    if not text:
        raise UserError("host list is empty")
    out: list[str] = []
    for part in _split_top(text):
        part = part.strip()
        if not part:
            raise UserError(f"host list {text!r}: empty name between commas")
        for name in _expand_one(part, text):
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", name):
                raise UserError(f"host list {text!r}: {name!r} is not a host name")
            if name not in out:
                out.append(name)
    return out


def _slurm_nodes(command: list[str], what: str, none: str) -> list[str]:
    """The node list a Slurm command prints (-o %N), expanded; one line if it cannot."""
    if shutil.which(command[0]) is None:
        raise UserError(f"{what} needs Slurm's `{command[0]}` on this machine (not found)")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        raise UserError(f"{what}: `{' '.join(command)}` did not answer in 30 s") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"{what}: `{' '.join(command)}` failed: {tail}")
    listed = done.stdout.split()
    if not listed:
        raise UserError(f"{what}: {none}")
    return expand(",".join(listed))


def job_nodes(job: str) -> list[str]:
    """The nodes of a Slurm job's allocation (squeue)."""
    if not re.match(r"^\d+(_\d+)?$", job):
        raise UserError(f"slurm job {job!r}: expected a job id such as 123456")
    return _slurm_nodes(
        ["squeue", "-h", "-j", job, "-o", "%N"], f"slurm job {job}",
        "no such running job (squeue lists no nodes)",
    )  # fmt: skip


def partition_nodes(partition: str) -> list[str]:
    """The nodes of a Slurm partition (sinfo)."""
    if not re.match(r"^[A-Za-z0-9_.-]+$", partition):
        raise UserError(f"slurm partition {partition!r}: not a partition name")
    return _slurm_nodes(
        ["sinfo", "-h", "-p", partition, "-o", "%N"], f"slurm partition {partition}",
        "no nodes (sinfo lists none)",
    )  # fmt: skip
