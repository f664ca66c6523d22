"""Which environment variables hold secrets, defined once for both sides.

The host agent redacts them in its state files; the control plane in dry runs and
manifests. Standard library only: this module ships in the zipapp.
"""

from __future__ import annotations

import re

SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|CREDENTIAL|_KEY$)", re.I
)
REDACTED = "***"


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Values of variables that look like secrets never reach a manifest, log or dry run."""
    return {k: (REDACTED if SECRET_NAME.search(k) else v) for k, v in env.items()}
