"""The cells of a sweep: each profile, at each point of a flag grid, each repeat.

`--grid speculative-num-steps=1,3,5 --grid speculative-eagle-topk=1,4` is the Cartesian
product of those server flags; each point relaunches the server with the profile's flags
overridden, and is named readably (`eagle3[steps=3,topk=4]`: the last word of each flag,
or the whole flag where two would collide). `--repeat N` measures every cell N times,
interleaved (all cells once, then all again) so a slow drift of the host does not favour
one side. A cell's key adds `#k` for the k-th repeat; its label (without `#k`) is what
`inv compare` groups by.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.archive.kept import ArmFields
from gpufleet.archive.layout import profile_label
from gpufleet.control.bench.request import BenchRequest
from gpufleet.control.inventory.model import Host
from gpufleet.control.server.profiles import FLAG_NAME, Profile, build_specs, load_profile
from gpufleet.errors import UserError
from gpufleet.records import FlagValue

MAX_CELLS = 1_000


@dataclass
class ArmSpec:
    """One sweep cell's server: a profile, the grid point's flag overrides, the repeat, and what
    the tune adds (flags dropped, files, variables)."""

    profile: str  # the profile's name or path, as the user gave it
    overrides: dict[str, FlagValue] = field(default_factory=dict)  # the grid point's flags
    repeat: int = 1  # 1-based
    label: str = ""  # profile stem plus the grid point: what compare groups by
    remove: list[str] = field(default_factory=list)  # flags dropped (tune's plain server)
    files: dict[str, str] = field(default_factory=dict)  # name -> path, for `{file:name}`
    env: dict[str, str] = field(default_factory=dict)  # variables set for this cell

    @property
    def key(self) -> str:
        """The cell's key in the sweep (the label, `#k` for repeat k)."""
        return self.label if self.repeat == 1 else f"{self.label}#{self.repeat}"

    def to_json(self) -> ArmFields:
        """The cell as the sweep's record keeps it."""
        return {
            "key": self.key,
            "profile": self.profile,
            "overrides": self.overrides,
            "repeat": self.repeat,
            "label": self.label,
            "remove": self.remove,
            **({"files": self.files} if self.files else {}),
            **({"env": self.env} if self.env else {}),
        }

    @classmethod
    def from_json(cls, data: ArmFields) -> ArmSpec:
        """A cell back from the sweep's record."""
        return cls(
            data["profile"],
            dict(data.get("overrides") or {}),
            int(data.get("repeat", 1)),
            data.get("label") or profile_label(data["profile"]),
            list(data.get("remove") or []),
            dict(data.get("files") or {}),
            dict(data.get("env") or {}),
        )

    def resolved_profile(self) -> Profile:
        """The profile with this cell's flags applied (a value of false drops the flag)."""
        base = load_profile(self.profile)
        changed = self.overrides or self.remove or self.files or self.env
        if not changed and self.label in ("", base.name):
            return base
        if not changed:  # the profile as written, under the cell's own name (tune's static)
            return base.model_copy(update={"name": self.label})
        flags = {k: v for k, v in base.flags.items() if k not in self.remove}
        flags.update(self.overrides)
        update = {
            "flags": flags,
            "name": self.label,
            "files": {**base.files, **self.files},
            "env": {**base.env, **self.env},
        }
        return base.model_copy(update=update)


def parse_grid(entries: list[str] | None) -> list[tuple[str, list[str]]]:
    """`--grid FLAG=V1,V2` (repeatable) -> [(flag, [values])]; one line on a bad entry."""
    grid: list[tuple[str, list[str]]] = []
    for entry in entries or []:
        flag, sep, values = entry.partition("=")
        flag = flag.strip().lstrip("-")
        items = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not FLAG_NAME.match(flag) or not items:
            raise UserError(
                f"--grid {entry!r}: expected FLAG=V1,V2,... (e.g. speculative-num-steps=1,3,5)"
            )
        if any(flag == seen for seen, _ in grid):
            raise UserError(f"--grid {entry!r}: {flag} is given twice")
        grid.append((flag, list(dict.fromkeys(items))))
    return grid


def short_names(flags: list[str]) -> dict[str, str]:
    """The last word of each flag (`speculative-eagle-topk` -> `topk`), unless two collide."""
    last = {flag: flag.split("-")[-1] for flag in flags}
    words = list(last.values())
    return {flag: (word if words.count(word) == 1 else flag) for flag, word in last.items()}


def _value(text: str) -> Any:
    """Grid values as YAML would read them in a profile: numbers, true/false, else text."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def interleaved(arms: list[ArmSpec], repeats: int) -> list[ArmSpec]:
    """The cells `repeats` times, every cell once and then again (a slow drift of the host
    cannot favour one side): the tune's verification and tie rounds."""
    return [replace(a, repeat=k) for k in range(1, repeats + 1) for a in arms]


def expand(profiles: list[str], grid: list[tuple[str, list[str]]], repeat: int) -> list[ArmSpec]:
    """Every cell in the order they run: repeats outermost, then profiles, then grid points."""
    names = short_names([flag for flag, _ in grid])
    points = list(itertools.product(*(values for _, values in grid))) if grid else [()]
    count = len(profiles) * len(points) * repeat
    if count > MAX_CELLS:
        raise UserError(
            f"the sweep has {count} cells (profiles x grid x repeats): at most {MAX_CELLS}"
        )
    arms = []
    for r in range(1, repeat + 1):
        for profile in profiles:
            for point in points:
                overrides = {flag: _value(v) for (flag, _), v in zip(grid, point, strict=True)}
                suffix = ",".join(
                    f"{names[flag]}={v}" for (flag, _), v in zip(grid, point, strict=True)
                )
                label = profile_label(profile) + (f"[{suffix}]" if suffix else "")
                arms.append(ArmSpec(profile, overrides, r, label))
    return arms


def plan_lines(
    arms: list[ArmSpec], hosts: list[Host], request: BenchRequest, engine: str | None
) -> list[str]:
    """What a sweep would do, cell by cell (the first repeat; the others say how many)."""
    lines = []
    repeats = max(a.repeat for a in arms)
    levels = ", ".join(f"C={lv.concurrency} x {lv.num_prompts}" for lv in request.levels())
    for arm in (a for a in arms if a.repeat == 1):
        prof = arm.resolved_profile()
        engines = {spec.engine for _, spec in build_specs(prof, hosts, engine)}
        lines.append(
            f"{arm.label} ({'/'.join(sorted(engines))}) on {', '.join(h.name for h in hosts)}:"
            f" gpu-clean -> launch -> bench [{levels}; {request.output_len} tokens each]"
            " -> stop -> verify clean"
        )
        if arm.overrides or arm.remove:
            changes = [f"--{k} {v}" for k, v in arm.overrides.items()]
            changes += [f"without --{k}" for k in arm.remove]
            lines.append(f"  flags: {', '.join(changes)}")
        lines += [f"  warning: {w}" for w in prof.warnings()]
    if repeats > 1:
        lines.append(
            f"{repeats} repeats: {len(arms)} cells, interleaved (every cell once, then again)"
        )
    return lines
