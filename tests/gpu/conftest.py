"""Real NVML, real processes holding real GPU memory (torch). Skipped without an NVIDIA driver.

Run on a GPU machine: `bash scripts/gpu-validate.sh` (what the lent H200 ran).
"""

import pytest
from gpuhelpers import gpu_host, nvidia_driver  # noqa: F401 (gpu_host is a fixture)


def pytest_collection_modifyitems(config, items):
    if nvidia_driver():
        return
    skip = pytest.mark.skip(reason="no NVIDIA driver on this machine (tests/gpu needs real NVML)")
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(skip)
