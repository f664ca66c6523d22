"""gpufleet: benchmark SGLang servers honestly across GPU hosts.

Kept import-light on purpose: `inv --list` imports this package, so nothing heavy
(fabric, paramiko, rich, pydantic) may be imported at module level here.
"""

__version__ = "0.1.0"
