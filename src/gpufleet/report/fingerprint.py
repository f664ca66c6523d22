"""What changes speed, per run, from its manifest: the GPUs (model, count, power limits,
clocks, persistence, ECC, MIG, links, health), the driver, CUDA, the engine version, the
kernel and the CPU governor. `inv compare` and the report flag an A/B pair whose fingerprints
differ; `--strict` refuses to compare it.
"""

from __future__ import annotations

from typing import Any

from gpufleet.archive.kept import Manifest

PER_GPU = {  # the manifest's per-GPU key -> how a difference is named
    "name": "GPU model",
    "power_limit_w": "power limits (W)",
    "sm_clock_app_mhz": "application clocks (MHz)",
    "persistence": "persistence mode",
    "ecc": "ECC",
    "mig": "MIG",
    "compute_mode": "compute mode",
    "pcie_gen_max": "PCIe generation",
    "pcie_width": "PCIe width",
    "nvlinks_up": "NVLinks up",
    "health": "GPU health",
}


Fact = str | int | float | bool | tuple[object, ...] | None  # one value, or one per GPU


def fingerprint(manifest: Manifest) -> dict[str, Fact]:
    """Label -> value; a per-GPU figure is the tuple over the GPUs the server ran on."""
    facts = manifest.host_facts
    gpus = facts.gpus or []
    used = manifest.server.gpus
    if used:
        gpus = [g for g in gpus if g.index in used] or gpus
    out: dict[str, Fact] = {
        "GPU count": len(used) if used else len(gpus) or None,
        "driver": facts.driver,
        "CUDA": facts.cuda,
        "engine version": manifest.server.engine_version,
        "kernel": facts.kernel,
        "CPU governor": facts.cpu_governor,
    }
    for key, label in PER_GPU.items():
        values = tuple(getattr(g, key) for g in gpus)
        if any(v is not None for v in values):
            out[label] = values[0] if len(set(values)) == 1 and key == "name" else values
    return out


def differences(a: Manifest, b: Manifest) -> list[tuple[str, Any, Any]]:
    """(label, A's value, B's value) for every fingerprint entry both runs recorded that
    differs (a run archived before an entry existed is not flagged for it)."""
    fa, fb = fingerprint(a), fingerprint(b)
    return [
        (label, fa[label], fb[label])
        for label in fa
        if label in fb
        and fa[label] is not None
        and fb[label] is not None
        and fa[label] != fb[label]
    ]
