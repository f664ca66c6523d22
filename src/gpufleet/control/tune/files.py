"""The files `inv tune` writes: the one-slot table that pins a speculative server at
depth 0 (a cell of the measurement), and at the end the tuned table and the profile that
ships it (playbooks/files/<name>.json, playbooks/<name>.yaml), each written atomically.
control/tune/table.py chooses the table; this module only puts it where SGLang reads it."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml

from gpufleet.archive import store
from gpufleet.control.server.engines import engine
from gpufleet.control.server.flagvalues import Flags
from gpufleet.control.server.profiles import PLAYBOOKS, load_profile
from gpufleet.control.sweep.cells import profile_label
from gpufleet.engine_facts import SKIP_ZERO_STEP_ENV, capture_sizes


class TuneResult(Protocol):
    """What of control/tune.TuneResult the files need (no import back into the chooser)."""

    table: Mapping[str, Mapping[str, list[int]]]  # SGLang's adaptive config
    ranges: list[str]
    skip_extend: bool


SKIP_ENV = {SKIP_ZERO_STEP_ENV: "1"}
DEPTH0_TABLE = {"1": {"candidate_steps": [0]}}


def depth0_config(profile: str) -> Path:
    """The one-slot table that pins the speculative server at depth 0 (a file, as SGLang
    reads its adaptive config), beside the profile's other files; written once."""
    playbooks = Path(profile).parent if profile.endswith((".yaml", ".yml")) else PLAYBOOKS
    path = playbooks / "files" / f"{profile_label(profile)}-depth0.json"
    text = json.dumps(DEPTH0_TABLE) + "\n"
    if not path.exists() or path.read_text() != text:
        store.make_dirs(path.parent)
        _write_text(path, text)
    return path


def output_paths(profile: str, name: str | None) -> tuple[Path, Path]:
    """Where the tune writes its table and its profile: playbooks/files/<name>.json and
    playbooks/<name>.yaml, beside the profile when given as a path."""
    is_path = profile.endswith((".yaml", ".yml"))
    playbooks = Path(profile).parent if is_path else PLAYBOOKS
    name = name or f"{profile_label(profile)}-tuned"
    return playbooks / "files" / f"{name}.json", playbooks / f"{name}.yaml"


def tuned_reference(profile: str, name: str | None) -> str:
    """How the verification names the tuned profile: a path when the profile was one."""
    _, profile_path = output_paths(profile, name)
    return str(profile_path) if profile.endswith((".yaml", ".yml")) else profile_path.stem


def write_outputs(profile: str, result: TuneResult, name: str | None) -> tuple[Path, Path]:
    """The table and the profile that ships it and passes it (`output_paths`), written
    atomically."""
    base = profile_label(profile)
    config_path, profile_path = output_paths(profile, name)
    store.make_dirs(config_path.parent)
    first = result.table["1"]["candidate_steps"][0]
    config_ref = relative_to_cwd(config_path)
    extends = base
    data = {
        "description": f"{base} with the adaptive table inv tune measured",
        "extends": extends,
        "files": {"adaptive-config": str(config_ref)},
        "flags": {
            "speculative-adaptive": True,
            "speculative-adaptive-config": "{file:adaptive-config}",
            "speculative-eagle-topk": 1,
            # SGLang starts at --speculative-num-steps, which must be a candidate (it refuses
            # to start otherwise): the depth of the slot that applies first, 0 included;
            # it then sets draft tokens to steps + 1 itself
            "speculative-num-steps": first,
            "speculative-num-draft-tokens": first + 1,
        },
    }
    if result.skip_extend:
        data["env"] = dict(SKIP_ENV)
    header = "".join(f"# {line}\n" for line in ["Written by `inv tune`:", *result.ranges])
    _write_text(config_path, json.dumps(result.table, indent=2) + "\n")
    _write_text(profile_path, header + yaml.safe_dump(data, sort_keys=False))
    return config_path, profile_path


def write_fixed(profile: str, name: str | None, flags: Flags, ranges: list[str]) -> Path:
    """The tuned profile of an engine with one draft depth for every load: the profile with
    that depth's flags (a flag set to false is dropped), no table."""
    _, profile_path = output_paths(profile, name)
    base = profile_label(profile)
    data = {
        "description": f"{base} at the one draft depth inv tune measured best",
        "extends": base,
        "flags": dict(flags),
    }
    header = "".join(f"# {line}\n" for line in ["Written by `inv tune`:", *ranges])
    store.make_dirs(profile_path.parent)
    _write_text(profile_path, header + yaml.safe_dump(data, sort_keys=False))
    return profile_path


def write_static(profile: str, name: str | None, arm: Any, why: str) -> Path:
    """The tuned profile written as one static server the verification measured (issue
    83.3: its table fell below the goal where this server did not): the profile with that
    server's flags (a flag it drops set to false, which a launch leaves out), files and
    variables, and `why` in its header."""
    _, profile_path = output_paths(profile, name)
    base = profile_label(profile)
    data = {
        "description": f"{base} as {arm.label}, the static server inv tune verified best",
        "extends": base,
        "flags": {**{flag: False for flag in arm.remove}, **arm.overrides},
        **({"files": dict(arm.files)} if arm.files else {}),
        **({"env": dict(arm.env)} if arm.env else {}),
    }
    said = textwrap.wrap(why, 96, break_on_hyphens=False, break_long_words=False)
    header = "".join(f"# {line}\n" for line in ["Written by `inv tune`:", *said])
    store.make_dirs(profile_path.parent)
    _write_text(profile_path, header + yaml.safe_dump(data, sort_keys=False))
    return profile_path


VERIFIED = "Verified on "


def note_verification(profile_path: Path, sentences: dict[str, str]) -> None:
    """The verification's sentence per host, word for word as the terminal and the record
    have it, in the tuned profile's header (wrapped to 100 columns, a note from an earlier
    verification replaced), so the profile says how it did wherever it travels."""
    text = profile_path.read_text()
    lines = text.splitlines(keepends=True)
    header = 0
    while header < len(lines) and lines[header].startswith("#"):
        header += 1
    kept, skipping = [], False
    for line in lines[:header]:  # an earlier verification's note (and its wrapped lines) goes
        if line.startswith(f"# {VERIFIED}"):
            skipping = True
        elif not (skipping and line.startswith("#   ")):
            skipping = False
            kept.append(line)
    notes = [
        "".join(f"{line}\n" for line in textwrap.wrap(
            f"{VERIFIED}{host}: {sentence}", 98, initial_indent="# ",
            subsequent_indent="#   ", break_on_hyphens=False, break_long_words=False))
        for host, sentence in sorted(sentences.items())
    ]  # fmt: skip
    _write_text(profile_path, "".join(kept) + "".join(notes) + "".join(lines[header:]))


def verification_notes(profile_path: Path) -> dict[str, str]:
    """The sentences note_verification wrote, unwrapped: host -> sentence."""
    found: dict[str, str] = {}
    host = None
    for line in profile_path.read_text().splitlines():
        if line.startswith(f"# {VERIFIED}"):
            host, _, sentence = line[len(f"# {VERIFIED}") :].partition(": ")
            found[host] = sentence
        elif host is not None and line.startswith("#   "):
            found[host] += " " + line[4:]
        else:
            host = None
    return found


def relative_to_cwd(path: Path) -> Path:
    """Profile file paths are read relative to where `inv` runs (the repository)."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path.resolve()


def restore(path: Path, data: bytes) -> None:
    """Put back a file the tune wrote, as it was (a mend that measured no better)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def profile_capture_sizes(profile: str) -> list[int] | None:
    """The capture sizes the profile's server will have (its flags, else SGLang's
    speculative defaults)."""
    loaded = load_profile(profile)
    flags = loaded.flags
    listed = flags.get("cuda-graph-bs")
    if isinstance(listed, str):
        listed = [int(x) for x in listed.replace(",", " ").split()]
    elif isinstance(listed, int):
        listed = [listed]
    cap = flags.get("cuda-graph-max-bs-decode") or flags.get("cuda-graph-max-bs")
    running = engine(loaded.engine).slots(flags)  # the adapter's rule, speculative cap included
    return capture_sizes(
        listed or None, int(cap) if cap else None, bool(flags.get("disable-cuda-graph")),
        max_running=int(running) if running else None, tp=loaded.tp,
        padding_disabled=bool(flags.get("disable-cuda-graph-padding")),
    )  # fmt: skip
