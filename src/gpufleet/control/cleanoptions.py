"""What `inv gpu-clean` asks of every host, as the task parses it (cli/options.py); a light
module, since `inv --list` reads its defaults, which are the agent's own (CleanArgs)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.host.protocol import CleanArgs


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

    def agent_args(self) -> CleanArgs:
        return CleanArgs(
            dry_run=self.dry_run,
            all_users=self.all_users,
            all_tenants=self.all_tenants,
            timeout_s=self.timeout_s,
            grace_s=self.grace_s,
            tolerance_mib=self.tolerance_mib,
            patterns=self.patterns or None,
            include_running=self.include_running,
        )
