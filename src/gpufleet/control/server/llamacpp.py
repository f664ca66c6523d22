"""What gpufleet knows of llama.cpp's `llama-server` flags: which GPUs it puts work on,
what it drafts with, how `inv tune` sets its draft depth (REFERENCE.md, llama.cpp's own
llama_model_load_from_file and common/arg.cpp)."""

from __future__ import annotations

import re

from gpufleet.control.server.flagvalues import EVERY_GPU, Flags, GpuClaim, flag_int


def draft_flags(flags: Flags) -> list[str]:
    """Its flags that make it draft: all go for the tune's plain server."""
    return [k for k in flags if "draft" in k or k in ("md", "spec-type")]


def depth(flags: Flags, d: int) -> Flags:
    """The flag that pins static draft depth d: this llama.cpp's --spec-draft-n-max, older
    builds' --draft-max (REFERENCE.md)."""
    name = "draft-max" if "draft-max" in flags else "spec-draft-n-max"
    return {name: d}


def refuses(flags: Flags) -> str | None:
    """Why `inv tune` cannot set this profile's draft depth, or None."""
    drafting = drafts(flags)
    if drafting is None:
        return "inv tune needs a draft model (model-draft) to set the depth of"
    if "unused" in drafting:
        return "its draft is unused without spec-type (e.g. draft-simple): nothing to tune"
    return None


def devices(flags: Flags) -> list[int] | None:
    """`--device`'s CUDA devices (CUDA0,CUDA2 -> [0, 2]; none -> []), None where unset or
    naming what NVML does not number (Vulkan, RPC)."""
    value = flags.get("device", flags.get("dev"))
    if value in (None, True, False):
        return None
    words = [w.strip() for w in str(value).split(",") if w.strip()]
    if [w.lower() for w in words] == ["none"]:
        return []
    cuda = [int(w[4:]) for w in words if re.fullmatch(r"CUDA\d+", w)]
    return cuda if len(cuda) == len(words) else None


def gpus(flags: Flags) -> GpuClaim:
    """The GPUs llama-server puts work on (llama_model_load_from_file: every GPU device,
    or --device's; --split-mode none keeps only --main-gpu's of them, a negative one none);
    layer and row split, with or without --tensor-split, open every one of them."""
    listed = devices(flags)
    mode = str(flags.get("split-mode", flags.get("sm", "layer"))).lower()
    if mode == "none":
        main = flag_int(flags, "main-gpu", "mg") or 0
        if main < 0:
            return []
        if listed is None:
            return [main]
        return [listed[main]] if main < len(listed) else listed
    return EVERY_GPU if listed is None else listed


def drafts(flags: Flags) -> str | None:
    """What it drafts with, in llama.cpp's words; None without a draft model."""
    draft = flags.get("model-draft") or flags.get("md")
    if not draft:
        return None
    kind = flags.get("spec-type")
    return f"draft model ({kind})" if kind else "draft model (no --spec-type: unused)"
