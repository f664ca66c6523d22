"""`import pynvml` on a simulated host resolves here (this folder is first on sys.path)."""

import gpufleet.sim.nvml_sim as _sim

globals().update({k: v for k, v in vars(_sim).items() if not k.startswith("__")})
