"""The tune's cells: the plain server (no drafting) and each static depth of the profile as
sweep cells, named so a cell's depth reads back from its label (`draft[depth=2]`)."""

from __future__ import annotations

import re

from gpufleet.control.server import engines
from gpufleet.control.server.profiles import Profile, load_profile
from gpufleet.control.sweep.cells import ArmSpec, profile_label
from gpufleet.control.tune.files import SKIP_ENV, depth0_config, relative_to_cwd
from gpufleet.control.tune.levels import ArmKey, Cells
from gpufleet.errors import UserError

PLAIN = "plain"  # the profile without speculation: what depth 0 is compared with
SKIP = "skip"  # depth 0 with SGLang's skip variable
DEPTH_LABEL = re.compile(r"\[depth=(\d+)(,skip)?\]$")


def drafting_of(base: Profile) -> engines.Drafting:
    """How the profile's engine sets its draft depth, or one line why it cannot be tuned."""
    drafting = engines.engine(base.engine).drafting
    if drafting is None:
        tunable = ", ".join(n for n, e in engines.ENGINES.items() if e.drafting)
        raise UserError(
            f"profile {base.name}: inv tune cannot set engine {base.engine}'s draft depth "
            f"(it can for {tunable})"
        )
    problem = drafting.refuse(base.flags)
    if problem:
        raise UserError(f"profile {base.name}: {problem}")
    return drafting


def plain_arm(profile: str, base: Profile, drafting: engines.Drafting) -> ArmSpec:
    """The profile without drafting: the bar every depth is measured against."""
    name = profile_label(profile)
    return ArmSpec(profile, {}, 1, f"{name}[{PLAIN}]", remove=drafting.flags(base.flags))


def depth_arms(profile: str, depths: list[int]) -> list[ArmSpec]:
    """The tune's cells: a plain server, each static depth, and on an adaptive engine depth 0
    as SGLang runs it (with and without the skip variable). On an engine with one depth for
    every load (llama.cpp) the plain server is depth 0."""
    base = load_profile(profile)
    drafting = drafting_of(base)
    name = profile_label(profile)
    arms = [plain_arm(profile, base, drafting)]
    if drafting.adaptive:
        pinned = {
            "speculative-adaptive": True,
            "speculative-adaptive-config": "{file:depth0-config}",
            "speculative-num-steps": 0,
            "speculative-eagle-topk": 1,
            "speculative-num-draft-tokens": 1,
        }
        files = {"depth0-config": str(relative_to_cwd(depth0_config(profile)))}
        arms += [
            ArmSpec(profile, pinned, 1, f"{name}[depth=0]", files=files),
            ArmSpec(profile, pinned, 1, f"{name}[depth=0,{SKIP}]", files=files, env=SKIP_ENV),
        ]
    remove = list(drafting.static_remove)
    for d in depths:
        overrides = drafting.depth(base.flags, d)
        arms.append(ArmSpec(profile, overrides, 1, f"{name}[depth={d}]", remove=remove))
    return arms


def static_chain_depth(base: Profile) -> int | None:
    """The depth of the profile's own static speculation where a table slot can hold it
    (SGLang's adaptive mode drafts a chain: topk 1, steps + 1 draft tokens), else None."""
    if not drafting_of(base).adaptive:
        return None
    flags = base.flags
    steps = flags.get("speculative-num-steps")
    topk = flags.get("speculative-eagle-topk")
    tokens = flags.get("speculative-num-draft-tokens")
    if not isinstance(steps, int) or topk not in (None, 1, "1"):
        return None
    return steps if tokens in (None, steps + 1, str(steps + 1)) else None


def arm_depth(arm: ArmSpec) -> int | str | None:
    """A measurement cell's depth from its label: d, PLAIN, SKIP (None: not a tune cell)."""
    if arm.label.endswith(f"[{PLAIN}]"):
        return PLAIN
    found = DEPTH_LABEL.search(arm.label)
    if found is None:
        return None
    return SKIP if found.group(2) else int(found.group(1))


def measured_columns(measured: Cells) -> list[tuple[ArmKey, str]]:
    """The measured table's columns in reading order: plain, depth 0 (and its skip
    variant), then the drafting depths."""
    depths = sorted(k for k in measured if isinstance(k, int))
    zero = "depth 0" if PLAIN in measured else "depth 0 (plain)"  # one depth per launch
    order = [(PLAIN, "plain")] + [(0, zero)] * (0 in depths) + [(SKIP, "depth 0 skip")]
    order += [(d, f"depth {d}") for d in depths if d != 0]
    return [(key, title) for key, title in order if key in measured]
