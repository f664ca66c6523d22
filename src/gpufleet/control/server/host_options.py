"""What `inv gpu-clean` and `inv launch` ask of every host, as the tasks parse them
(cli/gpu_tasks.py, cli/server_tasks.py); a light module, since `inv --list` reads its
defaults (gpu-clean's are the agent's own, CleanArgs)."""

from __future__ import annotations

import getpass
import socket
from dataclasses import dataclass, field

from gpufleet.control.server import engines
from gpufleet.errors import UserError
from gpufleet.host.agent.protocol import CleanArgs
from gpufleet.wire import carried


@dataclass
class CleanOptions:
    """What `inv gpu-clean` asks of every host; its defaults are the verb's (CleanArgs)."""

    dry_run: bool = CleanArgs.dry_run
    all_users: bool = CleanArgs.all_users
    all_tenants: bool = CleanArgs.all_tenants
    timeout_s: float = CleanArgs.timeout_s
    grace_s: float = CleanArgs.grace_s
    tolerance_mib: int = CleanArgs.tolerance_mib
    patterns: list[str] = field(default_factory=list)
    include_running: bool = CleanArgs.include_running
    clear_xids: list[int] = field(default_factory=list)
    clear_reason: str = CleanArgs.clear_reason

    def __post_init__(self) -> None:
        if self.clear_xids and not self.clear_reason.strip():
            raise UserError(
                "--clear-xid needs --reason (e.g. --reason 'reset with nvidia-smi -r'): "
                "the clear is logged on the host"
            )
        if self.clear_reason and not self.clear_xids:
            raise UserError("--reason goes with --clear-xid GPU (which GPUs were reset)")

    def agent_args(self) -> CleanArgs:
        """The verb's arguments, with every engine's patterns by default and who clears XIDs."""
        return carried(
            CleanArgs,
            self,
            patterns=self.patterns or engines.process_patterns(),
            clear_xids=self.clear_xids or None,
            cleared_by=_operator() if self.clear_xids else "",
        )


def _operator() -> str:
    """Who cleared the XIDs, as the control machine knows them (user@machine)."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


@dataclass
class LaunchOptions:
    """What `inv launch` asks of every host (and what sweep and tune cells launch with)."""

    replace: bool = False
    clean: bool = False
    engine: str | None = None
    timeout_s: float | None = None
    skip_flag_check: bool = False
    grace_s: float = 15.0
    allow_unhealthy: bool = False  # launch on a GPU the health check calls bad (recorded)
